"""Which libraries a workload's code reaches: the root package names found by walking its code's names
(globals, imports inside functions, closures, methods of the objects it uses). Self-contention advice uses it
to leave out a pool the process has but the workload never touches: the bench runs in a process where torch
is loaded (and its OpenMP pool sized), and a numpy workload should hear about BLAS, not torch.

The walk is static and bounded; when it cannot finish (too many objects), the answer is None: unknown, and
nothing is left out.
"""
from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterable
from typing import Any

LIMIT = 2000  # objects visited before the answer is "unknown"


def libraries(*objects: Any, limit: int = LIMIT) -> set[str] | None:
    """Root package names the objects' code can reach; None when the walk did not finish within limit."""
    found: set[str] = set()
    seen: set[int] = set()
    todo = list(objects)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if len(seen) > limit:
            return None
        if isinstance(obj, types.ModuleType):
            found.add(obj.__name__.split(".")[0])
            continue
        _add_module(found, getattr(obj, "__module__", None) if isinstance(obj, (type, types.FunctionType,
                                                                              types.BuiltinFunctionType))
                    else type(obj).__module__)
        todo.extend(_reaches(obj, found))
    return found


def _add_module(found: set[str], name: object) -> None:
    if isinstance(name, str) and name and name != "builtins":
        found.add(name.split(".")[0])


def _reaches(obj: Any, found: set[str]) -> Iterable[Any]:
    """The objects obj's code or contents refer to."""
    if isinstance(obj, types.FunctionType):
        for name in _code_names(obj.__code__):
            if name in obj.__globals__:
                yield obj.__globals__[name]
            elif name in sys.modules and "." not in name:  # an import inside the function
                found.add(name)
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                continue
        yield from (obj.__defaults__ or ())
    elif isinstance(obj, types.MethodType):
        yield obj.__func__
        yield obj.__self__
    elif isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
    elif isinstance(obj, type):
        if obj.__module__ != "builtins":
            yield from (v for v in vars(obj).values() if isinstance(v, (types.FunctionType, staticmethod,
                                                                         classmethod, property)))
    elif isinstance(obj, (staticmethod, classmethod)):
        yield obj.__func__
    elif isinstance(obj, property):
        yield obj.fget
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from list(obj)[:64]
    elif isinstance(obj, dict):
        yield from list(obj.values())[:64]
    elif not isinstance(obj, (types.BuiltinFunctionType, str, bytes, int, float, complex, bool)):
        yield type(obj)  # an instance: its class's methods
        yield from list(getattr(obj, "__dict__", {}).values())[:64]


def _code_names(code: types.CodeType) -> set[str]:
    """co_names of a code object and of every code object nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names
