"""The knob registry: every launch knob of the engine (an EngineConfig field with flag metadata), its
`infragent serve` flag, type, default and help; knob values to flags and back; the knobs as typer options."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, TypeVar

import typer

from infragent.engine.config import ConfigError, EngineConfig

F = TypeVar("F", bound=Callable[..., Any])


class KnobError(ConfigError):
    """A knob name or flag value the engine's command line cannot take; the message names the knob or flag."""


@dataclass(frozen=True)
class Knob:
    """One launch knob: an EngineConfig field and its `infragent serve` flag."""

    name: str
    flag: str
    aliases: tuple[str, ...]
    type: type  # the field's type without None: int, float, str, bool or list (of str)
    optional: bool  # None is a value; the default is then None, so an omitted flag gives it
    default: Any
    help: str

    def argv(self, value: Any) -> list[str]:
        """The flags that set this value: a bool as --x / --no-x, a list comma-joined, None as no flag."""
        if value is None:
            if not self.optional:
                raise KnobError(f"{self.name}: None is not a value of {self.flag}; give a {self.type.__name__}")
            return []
        if self.type is bool:
            if not isinstance(value, bool):
                raise KnobError(f"{self.name}: {value!r} is not a bool; give true or false")
            return [self.flag if value else _negation(self.flag)]
        return [self.flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]

    def option(self) -> Any:
        """This knob as a typer option (the default of a command parameter)."""
        names = [self.flag, *self.aliases]
        decls = [f"{n}/{_negation(n)}" for n in names] if self.type is bool else names
        return typer.Option(self.default, *decls, help=self.help)

    @property
    def cli_type(self) -> Any:
        """The type typer parses the flag as (a list travels as comma-separated text)."""
        parsed = str if self.type is list else self.type
        return Optional[parsed] if self.optional else parsed

    def flags(self) -> list[str]:
        """Every flag that sets this knob: the flag, its aliases and, for a bool, their --no- forms."""
        names = [self.flag, *self.aliases]
        return names + [_negation(n) for n in names] if self.type is bool else names

    def parse(self, text: str) -> Any:
        """The value of this flag's text (a list from comma-separated text)."""
        if self.type is list:
            return text.split(",") if text else None
        try:
            return self.type(text)
        except ValueError:
            raise KnobError(f"{self.flag}: {text!r} is not a valid {self.type.__name__} ({self.name})") from None

    def from_cli(self, value: Any) -> Any:
        """The knob value from what typer parsed (typer reads a list as its comma-separated text)."""
        return self.parse(value) if self.type is list and value is not None else value


def _negation(flag: str) -> str:
    return f"--no-{flag[2:]}"


def _registry() -> dict[str, Knob]:
    hints = typing.get_type_hints(EngineConfig)
    found = {}
    for f in dataclasses.fields(EngineConfig):
        if "flag" not in f.metadata:
            continue
        args = typing.get_args(hints[f.name])
        optional = type(None) in args
        base = next(a for a in args if a is not type(None)) if optional else hints[f.name]
        if optional and f.default is not None:
            raise TypeError(f"EngineConfig.{f.name}: an Optional knob must default to None (to_argv leaves None "
                            "out, so an omitted flag has to mean None)")
        found[f.name] = Knob(f.name, f.metadata["flag"], tuple(f.metadata["aliases"]),
                             typing.get_origin(base) or base, optional, f.default, f.metadata["help"])
    return found


KNOBS: dict[str, Knob] = _registry()


def knob(name: str) -> Knob:
    """The registry entry of one knob; KnobError names the unknown knob and lists the known ones."""
    if name not in KNOBS:
        raise KnobError(f"{name}: not an engine knob; known: {', '.join(KNOBS)}")
    return KNOBS[name]


def to_argv(values: dict[str, Any]) -> list[str]:
    """The `infragent serve` flags that set these knob values (a None value: its flag left out)."""
    return [arg for name, value in values.items() for arg in knob(name).argv(value)]


def from_argv(args: Iterable[str]) -> dict[str, Any]:
    """The knob values that these `infragent serve` flags set (--flag value, --flag=value, --x / --no-x);
    flags that are not knobs (--port, --hybrid-config, ...) are skipped with their value."""
    flags = {flag: k for k in KNOBS.values() for flag in k.flags()}
    values: dict[str, Any] = {}
    rest = list(args)
    while rest:
        flag, has_value, text = rest.pop(0).partition("=")
        entry = flags.get(flag)
        if entry is None:
            if not has_value and rest and not rest[0].startswith("-"):
                rest.pop(0)
        elif entry.type is bool:
            if has_value:
                raise KnobError(f"{flag}: takes no value; write {entry.flag} or {_negation(entry.flag)}")
            values[entry.name] = flag in (entry.flag, *entry.aliases)
        elif has_value or rest:
            values[entry.name] = entry.parse(text if has_value else rest.pop(0))
        else:
            raise KnobError(f"{flag}: needs a value ({entry.name} is {entry.type.__name__})")
    return values


def knob_options(names: Iterable[str] | None = None) -> Callable[[F], F]:
    """Decorate a typer command with one option per knob (all, or those named); the command gets every
    value in its `knobs: dict` parameter."""
    chosen = [knob(name) for name in names] if names is not None else list(KNOBS.values())

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "knobs"]
        if len(own) == len(signature.parameters):
            raise TypeError(f"{func.__name__}: knob_options passes the values as `knobs`; add `*, knobs: dict`")
        clash = sorted({p.name for p in own} & {k.name for k in chosen})
        if clash:
            raise TypeError(f"{func.__name__}: parameters {clash} are knobs already; remove them")
        added = [inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=k.option(), annotation=k.cli_type)
                 for k in chosen]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {k.name: k.from_cli(kwargs.pop(k.name)) for k in chosen}
            return func(*args, knobs=values, **kwargs)

        # typer reads inspect.signature and get_type_hints: both must show the knob options, not `knobs`
        params = own + added
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate
