"""Budgets, timeouts and sizes written the way people say them: ``90s``, ``1h30m``, ``4GiB``,
and durations as SLURM writes them (``01:30:00``, ``2-00:00:00``)."""

from __future__ import annotations

import math
import re

from autotune.core.errors import ConfigError

__all__ = ["format_duration", "parse_duration", "parse_size_mb"]

_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
#: SLURM's time forms: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (its bare minutes excepted:
#: a bare number is seconds here).
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+(?::\d+){0,2})")
#: How a duration may be written, for the errors.
FORMS = "90s, 10m, 2h, 1h30m or 01:30:00 (HH:MM:SS; a bare number is seconds)"


def parse_duration(text: str | int | float, *, what: str = "--budget") -> float:
    """Seconds in ``text``: ``90s``, ``10m``, ``2h``, ``1h30m``, a bare number of seconds, or
    SLURM's ``HH:MM:SS`` (also ``MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``).

    Each unit may appear once, in the order h, m, s. Raises ConfigError naming ``what``.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a duration like {FORMS}, got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        s = str(text).strip().lower().replace(" ", "")
        seconds = _parse_text(s, what)
    if not seconds > 0 or not math.isfinite(seconds):
        raise ConfigError(f"{what}: a duration must be positive and finite, got {text!r}")
    return seconds


def _parse_text(s: str, what: str) -> float:
    hint = f"{what}: cannot read {s!r} as a duration; write it like {FORMS}"
    if not s:
        raise ConfigError(hint)
    if re.fullmatch(r"\d+(\.\d+)?", s):  # a bare number of seconds (not inf, nan, 1e999)
        return float(s)
    clock = _CLOCK.fullmatch(s)
    if clock and (clock.group(1) is not None or ":" in s):
        return _clock_seconds(clock.group(1), clock.group(2), hint)
    pos, total, seen = 0, 0.0, ""
    for m in _PART.finditer(s):
        if m.start() != pos:
            raise ConfigError(hint)
        unit = m.group(2)
        if seen and "hms".index(unit) <= "hms".index(seen[-1]):
            raise ConfigError(hint)
        seen += unit
        total += float(m.group(1)) * _UNIT_SECONDS[unit]
        pos = m.end()
    if pos != len(s):
        raise ConfigError(hint)
    return total


def _clock_seconds(days: str | None, clock: str, hint: str) -> float:
    """``[D-]H[:M[:S]]`` with days, ``M:S`` or ``H:M:S`` without (SLURM's reading): seconds.
    Every field after the first is below 60."""
    fields = [int(x) for x in clock.split(":")]
    if any(x >= 60 for x in fields[1:]):
        raise ConfigError(hint.replace("; write", ": minutes and seconds are below 60; write"))
    if days is None:  # MM:SS, HH:MM:SS
        return float(sum(x * u for x, u in zip(fields, (3600, 60, 1)[-len(fields) :], strict=True)))
    # D-HH, D-HH:MM, D-HH:MM:SS
    return float(
        int(days) * 86400 + sum(x * u for x, u in zip(fields, (3600, 60, 1), strict=False))
    )


def format_duration(seconds: float) -> str:
    """The inverse of parse_duration for whole seconds: 5400 -> '1h30m'."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "")
    return out or "0s"


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)")
_SIZE_EXP = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size_mb(text: str | int | float, *, what: str = "--max-memory") -> float:
    """MiB in ``text``: ``4GiB``, ``4G``, ``512MB``, ``512M``, or a bare number of MiB.

    Decimal (GB) and binary (GiB) units are read as written.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size like 4GiB or 512MB, got {text!r}")
    if isinstance(text, (int, float)):
        mb = float(text)
    else:
        m = _SIZE.fullmatch(str(text).strip().lower())
        if not m:
            raise ConfigError(
                f"{what}: cannot read {text!r} as a size; write it like 4GiB or 512MB"
            )
        number, prefix, suffix = float(m.group(1)), m.group(2), m.group(3)
        if not prefix:
            mb = number if not suffix else number / 2**20  # bare number: MiB; "b": bytes
        else:
            base = 1024 if suffix.startswith("i") or suffix == "" else 1000
            mb = number * base ** _SIZE_EXP[prefix] / 2**20
    if not mb > 0 or not math.isfinite(mb):
        raise ConfigError(f"{what}: a size must be positive and finite, got {text!r}")
    return mb
