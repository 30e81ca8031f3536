"""Reading a stored record back into its dataclass, checking every value's type on the way: a
study may be someone else's, or an older autotune's, and a record that does not have the shape
its dataclass declares is refused here, in one line naming the attribute and the field, not
as a ``KeyError`` far from where it was written.

``read(cls, raw, where)`` follows the dataclass's type hints: ``int``, ``float`` (finite; an
int is taken), ``str`` (at most ``MAX_TEXT`` characters), ``bool``, ``None``, ``Any`` (taken
as it is: free-form detail no decision reads), ``list[T]``, ``tuple[T, ...]``,
``dict[str, T]``, unions (``T | None``) and nested dataclasses. A field with a default may be
missing (an older record); an unknown key is ignored (a newer one). Hand-written because
none of the declared dependencies validates a dataclass; pydantic would, at the cost of a
dependency (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar, Union

from autotune.core.errors import ConfigError

__all__ = ["MAX_TEXT", "RecordError", "read", "write"]

#: The longest text a record field may hold (a crafted study cannot flood a log line).
MAX_TEXT = 4000

T = TypeVar("T")


class RecordError(ConfigError):
    """A stored record does not have the shape its dataclass declares."""


def read(cls: type[T], raw: object, where: str) -> T:
    """``raw`` (a study attribute's value) as a ``cls``, every field type-checked;
    ``RecordError`` naming ``where`` and the field otherwise."""
    return typing.cast(T, _value(cls, raw, where))


def write(record: Any) -> dict[str, Any]:
    """A record dataclass as the mapping stored on the study: its fields as they are (the
    writer rounds what it measured), nested records as mappings, and an optional field that
    is None left out (the layout earlier releases wrote: absent, not null)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        if v is None and f.default is None:
            continue
        out[f.name] = _plain(v)
    return out


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return write(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _fail(where: str, want: str, got: object) -> RecordError:
    return RecordError(
        f"study record {where}: expected {want}, found {type(got).__name__}; the study was "
        f"written by another program or altered - use another --study-name"
    )


def _dataclass(cls: type, raw: object, where: str) -> Any:
    if not isinstance(raw, dict):
        raise _fail(where, "a mapping", raw)
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in raw:
            kwargs[f.name] = _value(hints[f.name], raw[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(
                f"study record {where}: field {f.name} is missing; the study "
                f"was written by another program - use another --study-name"
            )
    return cls(**kwargs)


def _value(tp: Any, raw: object, where: str) -> Any:  # noqa: C901 - one case per type form
    if tp is Any:
        return raw
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, raw, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        for arg in args:
            try:
                return _value(arg, raw, where)
            except RecordError:
                continue
        raise _fail(where, " or ".join(getattr(a, "__name__", str(a)) for a in args), raw)
    if tp is type(None):
        if raw is not None:
            raise _fail(where, "nothing", raw)
        return None
    if tp is bool:
        if not isinstance(raw, bool):
            raise _fail(where, "true or false", raw)
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise _fail(where, "a whole number", raw)
        return raw
    if tp is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise _fail(where, "a finite number", raw)
        return float(raw)
    if tp is str:
        if not isinstance(raw, str) or len(raw) > MAX_TEXT:
            raise _fail(where, f"text of at most {MAX_TEXT} characters", raw)
        return raw
    if origin in (list, tuple):
        if not isinstance(raw, (list, tuple)):
            raise _fail(where, "a list", raw)
        item = args[0] if args else Any
        out = [_value(item, x, f"{where}[{i}]") for i, x in enumerate(raw)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
            raise _fail(where, "a mapping with text keys", raw)
        item = args[1] if len(args) == 2 else Any
        return {k: _value(item, v, f"{where}.{k}") for k, v in raw.items()}
    raise TypeError(f"record type {tp!r} at {where} is not supported")  # a programming error
