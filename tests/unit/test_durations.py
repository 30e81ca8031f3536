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
        # SLURM's forms (its bare number is minutes; here a bare number stays seconds)
        ("01:30:00", 5400),
        ("1:30:00", 5400),
        ("00:00:45", 45),
        ("10:00", 600),  # MM:SS
        ("1-00:00:00", 86400),  # D-HH:MM:SS
        ("1-12", 129600),  # D-HH
        ("2-01:30", 178200),  # D-HH:MM
    ],
)
def test_parses_budgets(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "10x",
        "m10",
        "30m1h",
        "1h1h",
        "-5m",
        "0s",
        "1h 3",
        "00:00:00",
        "1:60",
        "1:2:3:4",
        "1h:30",
        "1-",
        ":30",
        "1:30s",
        "-1:00",
    ],
)
def test_rejects_unreadable_budgets_naming_the_flag(text):
    with pytest.raises(ConfigError, match="--budget"):
        parse_duration(text)


def test_an_unreadable_budget_says_every_form_it_takes():
    with pytest.raises(ConfigError) as e:
        parse_duration("two hours")
    assert "90s, 10m, 2h, 1h30m or 01:30:00 (HH:MM:SS; a bare number is seconds)" in str(e.value)
    with pytest.raises(ConfigError, match=r"minutes and seconds are below 60"):
        parse_duration("1:75:00")


def test_the_budget_flag_and_a_study_file_take_hh_mm_ss(tmp_path):
    from autotune.cli.main import build_parser
    from autotune.definition import settings
    from autotune.definition.studydef import StudyDefinition

    args = build_parser().parse_args(["run", "--budget", "01:30:00"])
    assert settings.flag_values(args, StudyDefinition)["budget_s"] == 5400
    study = tmp_path / "s.yaml"
    study.write_text("trainer: mlp\nbudget: '02:00:00'\ntrial_timeout: '1:30'\n")
    d = StudyDefinition.load(str(study))
    assert d.budget_s == 7200 and d.trial_timeout_s == 90


def test_format_is_the_inverse_for_whole_seconds():
    for s in (5, 90, 600, 5400, 3605):
        assert parse_duration(format_duration(s)) == s
