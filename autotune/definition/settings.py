"""How a run setting is declared, once, and what is generated from the declarations.

A setting is a dataclass field made with ``setting(...)`` (``StudyDefinition``'s fields in
``autotune.definition.studydef``): its key in a study definition file, its ``autotune run`` flag,
its
default, how YAML or flag text becomes its value (its ``Kind``), the rule the value keeps, and
one line that is both its documentation and its ``--help``. From these come the file loader
(``from_mapping``), the ``run`` command's flags (``add_flags``, ``flag_values``) and the check of
a made object (``check``, for ``__post_init__``); nothing restates a setting.

Every error names what the user wrote: ``--world-size: must be ...`` for a flag,
``study definition PATH: world_size must be ...`` for a file's key.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

import yaml

from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError
from autotune.definition.durations import format_duration, parse_duration, parse_size_mb

__all__ = ["Setting", "SettingError", "add_flags", "check", "declared", "flag_values"]
__all__ += ["from_mapping", "setting", "Choice", "Measured", "Nested", "Number", "Options"]
__all__ += ["Switch", "Text", "Whole", "DURATION", "SIZE", "Kind", "Label"]


@dataclass(frozen=True, kw_only=True)
class Label:
    """How an error names a setting: as the flag given, as a file's key, or as a field."""

    text: str  # --world-size, study definition PATH: world_size, or world_size
    flag: bool = False

    def says(self, problem: str) -> str:
        """``--world-size: must be ...`` or ``study definition P: world_size must be ...``."""
        return f"{self.text}: {problem}" if self.flag else f"{self.text} {problem}"


class SettingError(ConfigError):
    """Settings that break a rule: each blamed field -> the problem, worded to follow its name
    (``must be a whole number >= 1, got 0``). A rule of two settings blames both, so that the
    message can name the one the user gave on the command line."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        name, problem = next(iter(self.problems.items()))
        super().__init__(Label(text=name).says(problem))

    def named(self, cls: type, *, flags: Iterable[str] = (), where: str = "") -> ConfigError:
        """The error naming the flag of a blamed field in ``flags`` (the fields the command line
        set), else the blamed field's key in the file ``where`` (else the field itself)."""
        given = set(flags)
        name = next((n for n in self.problems if n in given), next(iter(self.problems)))
        s = declared(cls)[name]
        if name in given and s.flag:
            label = Label(text=s.flag, flag=True)
        else:
            label = Label(text=f"{where}: {s.key}" if where else name)
        return ConfigError(label.says(self.problems[name]))


class Kind:
    """How one kind of setting is written, read and checked (the subclasses below)."""

    metavar = "VALUE"
    action = "store"

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
    def metavar(self) -> str:  # type: ignore[override]
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


_SETTING = "autotune.setting"


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting: where the user writes it, what it means, the rule it keeps."""

    key: str = ""
    """Its key in a study definition file."""
    flag: str | None
    """Its ``autotune run`` flag; None: only in a study definition file."""
    kind: Kind
    """How it is written, read and checked."""
    default: Any
    """The value when neither the file nor a flag gives one."""
    help: str
    """One line: its documentation and its ``--help``."""
    metavar: str | None = None
    """The placeholder ``--help`` shows (default: the kind's)."""
    unset: str | None = None
    """What None means, for a setting whose default is None (``--help`` shows it)."""
    required: bool = False
    """A study definition file must give it."""

    def read(self, raw: Any, label: Label) -> Any:
        """A value as YAML or a flag gives it -> the checked value; errors name ``label``."""
        if raw is None and self.default is None:
            return None
        value = self.kind.parse(raw, label)
        problem = self.problem(value)
        if problem:
            raise ConfigError(label.says(problem))
        return value

    def problem(self, value: Any) -> str | None:
        if value is None and self.default is None:
            return None
        return self.kind.problem(value)

    def help_text(self) -> str:
        """The help with its default, escaped for argparse."""
        shown = self.unset if self.default is None else self.kind.show(self.default)
        return f"{self.help} (default: {shown})".replace("%", "%%")


def setting(default: Any, kind: Kind, *, help: str, flag: str | None = "", **more: Any) -> Any:
    """A dataclass field that is a setting; ``more``: ``Setting``'s other fields. The key
    defaults to the field's name and the flag to ``--KEY`` with dashes; ``flag=None`` keeps it to
    study definition files."""
    if default is None and more.get("unset") is None:
        raise TypeError("a setting whose default is None says what None means (unset=...)")
    s = Setting(default=default, kind=kind, help=help, flag=flag, **more)
    meta = {_SETTING: s}
    if isinstance(default, (dict, list, set)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@cache
def declared(cls: type) -> dict[str, Setting]:
    """A settings dataclass's settings by field name, in declaration order, keys and flags
    filled in."""
    out = {}
    for f in fields(cls):
        s = f.metadata.get(_SETTING)
        if s is None:
            continue
        key = s.key or f.name
        flag = ("--" + key.replace("_", "-")) if s.flag == "" else s.flag
        out[f.name] = dataclasses.replace(s, key=key, flag=flag)
    return out


def check(obj: Any) -> None:
    """Every setting of a settings dataclass within its rule (for ``__post_init__``)."""
    for name, s in declared(type(obj)).items():
        problem = s.problem(getattr(obj, name))
        if problem:
            raise SettingError({name: problem})


def from_mapping(cls: type, data: Mapping[str, Any], *, where: str, **fixed: Any) -> Any:
    """A settings dataclass from a file's mapping; every error names ``where`` and the key.
    ``fixed``: fields that are not settings (a definition's name)."""
    decl = declared(cls)
    by_key = {s.key: (name, s) for name, s in decl.items()}
    required = [s.key for s in decl.values() if s.required]
    _yaml.check_keys(data, where=where, allowed=by_key, required=required)
    values = {}
    for key, raw in data.items():
        name, s = by_key[key]
        values[name] = s.read(raw, Label(text=f"{where}: {key}"))
    try:
        return cls(**fixed, **values)
    except SettingError as e:
        raise e.named(cls, where=where) from None


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per setting of ``cls`` that has one; an absent flag leaves ``None``."""
    for name, s in declared(cls).items():
        if not s.flag:
            continue
        kw: dict[str, Any] = {"dest": name, "default": None, "help": s.help_text()}
        if s.kind.action == "switch":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["action"] = s.kind.action
            kw["metavar"] = s.metavar or s.kind.metavar
        parser.add_argument(s.flag, **kw)


def flag_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The settings the command line gave (field name -> checked value); errors name the
    flag."""
    out = {}
    for name, s in declared(cls).items():
        raw = getattr(args, name, None) if s.flag else None
        if raw is not None:
            out[name] = s.read(raw, Label(text=s.flag, flag=True))
    return out
