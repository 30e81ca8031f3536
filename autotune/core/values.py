"""Rules a single value must keep, as functions that say why a value breaks them (None: it
keeps them). The knob registry (``knobs``) builds each knob's legality from these.

And values written for people, the one way every line the run prints or the report shows
writes them: ``number`` (54,350 and 5.435, never ``5.435e+04``), ``seconds`` (1.25 s, 12.3 ms,
45 us), ``nbytes`` (4 KiB, 64.2 MiB), ``speedup`` (1.52x) and ``speedup_interval`` (1.52x
[1.47, 1.58], or why it is no result).
"""

from __future__ import annotations

import math
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
    "nbytes",
    "number",
    "positive_number",
    "seconds",
    "shown",
    "PRECISE",
    "precise",
    "speedup",
    "speedup_interval",
    "terminal_safe",
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


def terminal_safe(text: str) -> str:
    """``text`` with every control and format character escaped as Python writes it (``\\x1b``,
    ``\\n``, ``\\u202e``): what reaches a terminal from a profile, a study, a database or a
    command can draw nothing over autotune's own lines, nor move the cursor."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: a value from a file or a study, quoted in a
    one-line message, keeps the line short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def number(x: float, digits: int = 4) -> str:
    """``x`` for people: from 1,000 up a whole number with thousands separated (54,350), below
    it ``digits`` significant digits with no trailing zeros (543.2, 5.435, 0.05435, 12); never
    an exponent. Not finite: as Python writes it (nan, inf)."""
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 999.5 or x == 0:
        return f"{x:,.0f}"
    places = min(max(digits - 1 - math.floor(math.log10(abs(x))), 0), 12)
    text = f"{x:.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def seconds(s: float) -> str:
    """A duration of a step or a message: 1.25 s, 12.3 ms, 45 us."""
    if s >= 1 or s <= 0:
        return f"{number(s, 3)} s"
    if s >= 1e-3:
        return f"{number(s * 1e3, 3)} ms"
    return f"{number(s * 1e6, 3)} us"


def nbytes(b: float) -> str:
    """A size in binary units: 512 B, 4 KiB, 64.2 MiB, 1.5 GiB."""
    for unit, n in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= n:
            return f"{number(b / n, 3)} {unit}"
    return f"{number(b, 3)} B"


def speedup(x: float, digits: int = 2) -> str:
    """The one way a ratio to the defaults is written alone: 1.52x (two decimals: noise below
    1 % is not news; ``digits`` more where a table sets small effects side by side)."""
    return f"{x:.{digits}f}x" if math.isfinite(x) else f"{x}x"


def ratio_interval(median: float, low: float, high: float, *, digits: int = 2) -> str:
    """The one way a ratio is written with its 95 % interval: ``1.59x [1.50, 1.68]``
    (``digits`` decimals; a figure of a result a person reads goes through
    ``speedup_interval``, which applies the precision rule first)."""
    return f"{median:.{digits}f}x [{low:.{digits}f}, {high:.{digits}f}]"


#: A speedup a person reads as a result (the run's summary, the profile, the report) is shown
#: with its interval only when its 95 % interval lies within +-``PRECISE`` of it.
PRECISE = 0.25


def precise(median: float, low: float | None, high: float | None, within: float = PRECISE) -> bool:
    """Whether the interval ``[low, high]`` lies within +-``within`` of ``median`` (an
    unbounded side, None or infinite, never does)."""
    if low is None or high is None or not median > 0:
        return False
    return median * (1 - within) <= low and high <= median * (1 + within)


def speedup_interval(
    median: float,
    low: float | None,
    high: float | None,
    rounds: int | None,
    *,
    digits: int = 2,
    settle: int | None = None,
) -> str:
    """The one way a speedup with its 95 % interval is written for people:
    ``1.59x [1.50, 1.68]``. An interval wider than +-``PRECISE`` of its median is no result,
    and says so with what it was measured over (``rounds``) and, when known, the rounds that
    would settle it (``settle``; ``stats.rounds_to_settle``): ``not measured precisely enough
    (2 rounds: 0.36-4.65x; about 5 rounds would settle it)``."""

    if precise(median, low, high):
        assert low is not None and high is not None
        return ratio_interval(median, low, high, digits=digits)
    said = [] if rounds is None else ["1 round" if rounds == 1 else f"{rounds} rounds"]
    if low is not None and high is not None and 0 < low <= high < math.inf:
        said.append(f"{low:.{digits}f}-{high:.{digits}f}x")
    more = "" if settle is None else f"; about {settle} rounds would settle it"
    return f"not measured precisely enough ({': '.join(said) or 'no interval'}{more})"
