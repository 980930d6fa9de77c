"""Resolve 'module:function' names (from the working directory and PYTHONPATH) into callables."""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable


class CallableError(ValueError):
    """A module:function name that cannot be resolved; the message says which part and what to do."""


def resolve(name: str, what: str = "callable") -> Callable[..., Any]:
    """Import module and return its attribute, e.g. 'mykernels:fast_matmul' or 'pkg.mod:Class.method'."""
    if ":" not in name:
        raise CallableError(f"{what} {name!r} must look like module:function (e.g. mykernels:matmul)")
    module_name, _, attr_path = name.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CallableError(f"{what} {name!r}: cannot import module {module_name!r} ({err}); "
                            "run from its directory or add it to PYTHONPATH") from err
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise CallableError(f"{what} {name!r}: module {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CallableError(f"{what} {name!r} is not callable")
    return target
