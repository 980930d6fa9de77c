"""Resolve 'module:function' names (from the working directory and PYTHONPATH) or 'path/file.py:function'
into callables."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


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
