"""English text that needs no download: docstrings of the Python standard library, read with ast at run time.

Two disjoint splits by module: "calibration" (SmoothQuant's activation ranges) and "evaluation" (the quality
gates' held-out text). The text depends on the Python version; within one run both sides see the same.
"""
from __future__ import annotations

import ast
import sysconfig
from functools import lru_cache
from pathlib import Path

SPLITS = {
    "calibration": ("argparse.py", "collections/__init__.py", "configparser.py", "logging/__init__.py"),
    "evaluation": ("textwrap.py", "functools.py", "pathlib.py", "statistics.py", "subprocess.py", "inspect.py",
                   "typing.py", "json/__init__.py", "shutil.py", "enum.py", "dataclasses.py", "fractions.py"),
}
MIN_CHARS = 200  # shorter docstrings are mostly one-line signatures


class CorpusError(RuntimeError):
    """The standard library's sources are not where sysconfig says (a stripped Python)."""


@lru_cache(maxsize=None)
def docstrings(split: str) -> tuple[str, ...]:
    """Every docstring of at least MIN_CHARS characters in the split's modules, in source order."""
    if split not in SPLITS:
        raise ValueError(f"split: {split!r}; choose one of {', '.join(SPLITS)}")
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    for name in SPLITS[split]:
        path = root / name
        if not path.exists():
            raise CorpusError(f"{path}: missing; the held-out text is read from the standard library's sources")
        tree = _parse(path.read_text(encoding="utf-8"))
        nodes = [tree] + [n for n in ast.walk(tree)
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        found += [doc for doc in (ast.get_docstring(n, clean=True) for n in nodes) if doc and len(doc) >= MIN_CHARS]
    return tuple(found)


def _parse(source: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SystemError:  # CPython < 3.11.8 (gh-106905): a parse in another thread at the same moment (3.11's
        return ast.parse(source)  # traceback carets parse too) corrupts a shared depth counter; it is spurious


def token_windows(encode, split: str, window: int, count: int) -> list[list[int]]:
    """count windows of window tokens each, cut in order from the split's docstrings joined by blank lines."""
    tokens: list[int] = []
    for doc in docstrings(split):
        tokens += encode(doc + "\n\n")
        if len(tokens) >= window * count:
            break
    windows = [tokens[i * window:(i + 1) * window] for i in range(min(count, len(tokens) // window))]
    if len(windows) < count:
        raise CorpusError(f"split {split!r}: only {len(windows)} windows of {window} tokens; ask for fewer")
    return windows
