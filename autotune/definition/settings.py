"""How a run setting is declared, once, and what is generated from the declarations.

A setting is a dataclass field made with ``setting(...)`` (``StudyDefinition``'s fields in
``definition.studydef``): its key in a study definition file, its ``autotune run`` flag, its
default, how YAML or flag text becomes its value (its ``Kind``, ``definition.kinds``), the rule
the value keeps, and one line that is both its documentation and its ``--help``. From these come
the file loader (``from_mapping``), the ``run`` command's flags (``add_flags``, ``flag_values``)
and the check of a made object (``check``, for ``__post_init__``); nothing restates a setting.

Every error names what the user wrote: ``--world-size: must be ...`` for a flag,
``study definition PATH: world_size must be ...`` for a file's key.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError
from autotune.definition.kinds import Kind, Label

__all__ = ["Setting", "SettingError", "add_flags", "check", "declared", "flag_values"]
__all__ += ["from_mapping", "setting"]


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
    shown: str | None = None
    """What ``--help`` shows as the default where the value in effect is not the default
    itself (the re-validation's, which the budget fits: ``from the budget, ...``)."""
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
        return f"{self.help} (default: {self.shown or shown})".replace("%", "%%")


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
