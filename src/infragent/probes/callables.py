"""Resolve 'module:function' names (from the working directory and PYTHONPATH) or 'path/file.py:function'
into callables."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

log = logging.getLogger("infragent.callables")


class CallableError(ValueError):
    """A module:function name that cannot be resolved; the message says which part and what to do."""


def resolve(name: str, what: str = "callable") -> Callable[..., Any]:
    """Import module and return its attribute, e.g. 'mykernels:fast_matmul' or 'pkg.mod:Class.method'."""
    if ":" not in name:
        raise CallableError(f"{what} {name!r} must look like module:function (e.g. mykernels:matmul)")
    module_name, _, attr_path = name.partition(":")
    if module_name.endswith(".py"):
        return from_file(Path(module_name), attr_path, what)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CallableError(f"{what} {name!r}: cannot import module {module_name!r} ({err}); "
                            "run from its directory or add it to PYTHONPATH") from err
    return _attribute(module, attr_path, f"{what} {name!r}")


def _attribute(module: ModuleType, attr_path: str, label: str) -> Callable[..., Any]:
    """module.a.b for attr_path 'a.b', which must be callable; errors start with label."""
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise CallableError(f"{label}: no attribute {part!r} (looking up {attr_path!r})")
        target = getattr(target, part)
    if not callable(target):
        raise CallableError(f"{label} is not callable")
    return target


def from_file(path: Path, attr_path: str, what: str = "callable") -> Callable[..., Any]:
    """A function of a Python file loaded by path, under a module name unique to that path (so two copies of
    the same file, e.g. the baseline's and a candidate worktree's, load side by side)."""
    return _attribute(_load_file(path, what), attr_path, f"{path}: {what} {attr_path!r}")


def _load_file(path: Path, what: str) -> ModuleType:
    path = path.resolve()
    key = "infragent_file_" + hashlib.sha1(str(path).encode()).hexdigest()[:12] + "_" + path.stem
    if key in sys.modules:
        return sys.modules[key]
    if not path.is_file():
        raise CallableError(f"{path}: {what}: no such file")
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[key]
        raise CallableError(f"{path}: {what}: importing it raised {type(err).__name__}: {err}") from err
    return module


_STAMPS: dict[str, tuple[int, int]] = {}  # a user module's file -> (mtime_ns, size) after the call that used it


def refresh_modules(root: Path) -> list[str]:
    """Forget every module loaded from a file under root once any of those files changed (or vanished, or
    was never stamped) since stamp_modules, so the next resolve imports the code as it is now (an edited or
    added function is seen, and a module importing an edited one is not left holding the old one); the names
    forgotten."""
    mine = _user_modules(root)
    if all(_STAMPS.get(str(path)) == _stamp(path) for path in mine.values()):
        return []
    return _forget(mine)


def forget_modules(root: Path) -> list[str]:
    """Forget every user module loaded from a file under root (what a finished run loaded), first calling
    the module's own close() where it has one, so that what it cached (engines, their threads) is freed;
    the names forgotten."""
    return _forget(_user_modules(root))


def _forget(modules: dict[str, Path]) -> list[str]:
    for name, path in modules.items():
        module = sys.modules.pop(name, None)
        _STAMPS.pop(str(path), None)
        close = getattr(module, "close", None)
        if callable(close) and getattr(close, "__module__", None) == getattr(module, "__name__", None):
            try:
                close()
            except Exception as err:  # the user's cleanup failing must not fail the run that used it
                log.warning("%s: close() raised %s: %s", path, type(err).__name__, err)
    importlib.invalidate_caches()
    return sorted(modules)


def stamp_modules(root: Path) -> None:
    """Note the files of the modules under root as they are now (after a call that may have imported them)."""
    for path in _user_modules(root).values():
        _STAMPS[str(path)] = _stamp(path)


def _user_modules(root: Path) -> dict[str, Path]:
    """The user's modules under root: not infragent itself, nor anything installed (a virtualenv under root)."""
    root, prefix = root.resolve(), Path(sys.prefix).resolve()
    found = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name == "infragent" or name.startswith("infragent."):
            continue
        path = Path(file).resolve()
        installed = path.is_relative_to(prefix) or {"site-packages", "dist-packages"} & set(path.parts)
        if path.is_relative_to(root) and not installed:
            found[name] = path
    return found


def _stamp(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (-1, -1)
    return (stat.st_mtime_ns, stat.st_size)
