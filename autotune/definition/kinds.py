"""The kinds of a run setting's value (``definition.settings``): how YAML or flag text becomes
the value, the rule it keeps, how it is shown; and how an error names the setting (``Label``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import yaml

from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError
from autotune.definition.durations import format_duration, parse_duration, parse_size_mb

__all__ = ["DURATION", "SIZE", "Choice", "Kind", "Label", "Measured", "Nested", "Number"]
__all__ += ["Options", "Switch", "Text", "Whole"]


@dataclass(frozen=True, kw_only=True)
class Label:
    """How an error names a setting: as the flag given, as a file's key, or as a field."""

    text: str  # --world-size, study definition PATH: world_size, or world_size
    flag: bool = False

    def says(self, problem: str) -> str:
        """``--world-size: must be ...`` or ``study definition P: world_size must be ...``."""
        return f"{self.text}: {problem}" if self.flag else f"{self.text} {problem}"


class Kind:
    """How one kind of setting is written, read and checked (the subclasses below)."""

    action = "store"

    @property
    def metavar(self) -> str:
        """The flag's placeholder in ``--help`` (read-only: ``Choice`` works it out)."""
        return "VALUE"

    def parse(self, raw: Any, label: Label) -> Any:
        """A value as YAML or a flag gives it -> the setting's value (checked afterwards)."""
        return raw

    def problem(self, value: Any) -> str | None:
        """The rule a value breaks, worded to follow its name; None when it keeps them all."""
        return None

    def show(self, value: Any) -> str:
        """A default as ``--help`` shows it."""
        return str(value)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _from_text(convert: Callable[[str], Any], raw: Any) -> Any:
    """A flag's text converted; anything else (YAML's values, bad text) as it is, for the
    kind's rule to judge."""
    try:
        return convert(raw.strip()) if isinstance(raw, str) else raw
    except ValueError:
        return raw


@dataclass(frozen=True, kw_only=True)
class Whole(Kind):
    """A whole number, at least ``low`` when given."""

    low: int | None = None
    metavar = "N"

    def rule(self) -> str:
        return "must be a whole number" + ("" if self.low is None else f" >= {self.low}")

    def parse(self, raw: Any, label: Label) -> Any:
        return _from_text(int, raw)

    def problem(self, value: Any) -> str | None:
        ok = _is_int(value) and (self.low is None or value >= self.low)
        return None if ok else f"{self.rule()}, got {value!r}"


@dataclass(frozen=True, kw_only=True)
class Number(Kind):
    """A number strictly between ``low`` and ``high``: ``what`` it is, ``hint`` how to read it."""

    low: float
    high: float
    what: str = "a number"
    hint: str = ""
    metavar = "X"

    def parse(self, raw: Any, label: Label) -> Any:
        return _from_text(float, raw)

    def problem(self, value: Any) -> str | None:
        if _is_number(value) and self.low < value < self.high:
            return None
        hint = f" ({self.hint})" if self.hint else ""
        between = f"above {self.low:g} and below {self.high:g}{hint}"
        return f"must be {self.what} {between}, got {value!r}"


@dataclass(frozen=True, kw_only=True)
class Switch(Kind):
    """On or off: ``true``/``false`` in a file, ``--x``/``--no-x`` on the command line."""

    action = "switch"

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"

    def show(self, value: Any) -> str:
        return "on" if value else "off"


@dataclass(frozen=True, kw_only=True)
class Text(Kind):
    """A string; ``what`` names what it holds (in errors), ``empty`` whether '' is one."""

    what: str
    empty: bool = False
    metavar = "NAME"

    def parse(self, raw: Any, label: Label) -> Any:
        return str(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else raw

    def problem(self, value: Any) -> str | None:
        if isinstance(value, str) and (self.empty or value.strip()):
            return None
        return f"must be {self.what}, got {value!r}"


@dataclass(frozen=True, kw_only=True)
class Choice(Kind):
    """One of ``options``; spaces are dropped, case and YAML lists (``[a, b]`` is ``a,b``)
    folded."""

    options: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return "|".join(self.options)

    def parse(self, raw: Any, label: Label) -> Any:
        if isinstance(raw, (list, tuple)):
            raw = ",".join(map(str, raw))
        return raw.replace(" ", "").lower() if isinstance(raw, str) else raw

    def problem(self, value: Any) -> str | None:
        if value in self.options:
            return None
        return f"must be one of {', '.join(self.options)}, got {value!r}"


@dataclass(frozen=True, kw_only=True)
class Measured(Kind):
    """A positive amount read by ``read`` (``parse_duration``: ``90s``, ``1h30m``;
    ``parse_size_mb``: ``4GiB``, ``512MB``), bare numbers in ``unit``."""

    read: Callable[..., float]
    unit: str
    metavar: str = "VALUE"
    fmt: Callable[[float], str] = str

    def parse(self, raw: Any, label: Label) -> Any:
        return self.read(raw, what=label.text)

    def problem(self, value: Any) -> str | None:
        ok = _is_number(value) and value > 0
        return None if ok else f"must be a positive number of {self.unit}, got {value!r}"

    def show(self, value: Any) -> str:
        return self.fmt(value)


DURATION = Measured(read=parse_duration, unit="seconds", metavar="DURATION", fmt=format_duration)
SIZE = Measured(read=parse_size_mb, unit="MiB", metavar="SIZE")


@dataclass(frozen=True, kw_only=True)
class Options(Kind):
    """Keyword options: a mapping in a file; ``KEY=VALUE`` (a YAML value), repeatable, on the
    command line."""

    metavar = "KEY=VALUE"
    action = "append"

    def parse(self, raw: Any, label: Label) -> Any:
        if raw is None:
            return {}
        if not (label.flag and isinstance(raw, list)):
            return raw
        out = {}
        for item in raw:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(label.says(f"write {item!r} as KEY=VALUE, e.g. width=1024"))
            try:
                out[key] = yaml.safe_load(value)
            except yaml.YAMLError:
                raise ConfigError(
                    label.says(f"{item!r}: the value is not YAML; quote it, e.g. {key}='...'")
                ) from None
        return out

    def problem(self, value: Any) -> str | None:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return None
        return f"must be a mapping of keyword options, got {value!r}"

    def show(self, value: Any) -> str:
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"


@dataclass(frozen=True, kw_only=True)
class Nested(Kind):
    """A nested config dataclass that checks itself (``MeasureSettings``), written as a
    mapping of its fields; ``rule`` adds what a study needs beyond the class's own rules."""

    cls: type
    rule: Callable[[Any], str | None] | None = None

    def parse(self, raw: Any, label: Label) -> Any:
        if raw is None:
            return self.cls()
        if not isinstance(raw, dict):
            return raw
        _yaml.check_keys(raw, where=label.text, allowed=[f.name for f in fields(self.cls)])
        try:
            return self.cls(**raw)
        except ConfigError as e:  # its messages start with the field: measure.window_s ...
            raise ConfigError(f"{label.text}.{e}") from None

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, self.cls):
            names = ", ".join(f.name for f in fields(self.cls))
            return f"must be a mapping of {names}, got {value!r}"
        return None if self.rule is None else self.rule(value)
