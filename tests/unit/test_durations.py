import pytest

from autotune.core.errors import ConfigError
from autotune.definition.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("10m", 600),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h0m5s", 3605),
        ("45", 45),
        ("1.5m", 90),
        (" 2H ", 7200),
        (30, 30),
    ],
)
def test_parses_budgets(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "m10", "30m1h", "1h1h", "-5m", "0s", "1h 3"])
def test_rejects_unreadable_budgets_naming_the_flag(text):
    with pytest.raises(ConfigError, match="--budget"):
        parse_duration(text)


def test_format_is_the_inverse_for_whole_seconds():
    for s in (5, 90, 600, 5400, 3605):
        assert parse_duration(format_duration(s)) == s
