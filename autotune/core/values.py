"""Rules a single value must keep, as functions that say why a value breaks them (None: it
keeps them). The knob registry (``knobs``) builds each knob's legality from these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "boolean",
    "int_at_least",
    "int_range",
    "is_int",
    "is_number",
    "number_in",
    "one_of",
    "positive_number",
    "shown",
]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def int_at_least(lo: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if is_int(v) and v >= lo else f"must be an integer >= {lo}"

    return check


def one_of(choices: tuple[Any, ...]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(str, choices))}"

    return check


def int_range(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if is_int(v) and lo <= v <= hi else f"must be an integer in [{lo}, {hi}]"

    return check


def positive_number(v: Any) -> str | None:
    ok = is_number(v) and 0 < v < float("inf")
    return None if ok else "must be a positive finite number"


def number_in(lo: float, hi: float) -> Callable[[Any], str | None]:
    """A finite number above ``lo`` and at most ``hi``."""

    def check(v: Any) -> str | None:
        ok = is_number(v) and lo < v <= hi
        return None if ok else f"must be a number above {lo:g} and at most {hi:g}"

    return check


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: a value from a file or a study, quoted in a
    one-line message, keeps the line short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
