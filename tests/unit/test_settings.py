"""Run settings declared once (``autotune.definition.settings``): the study definition loader and
the
``run`` command's flags are generated from the same declarations, and every error names what
the user wrote."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields

import pytest

from autotune.cli.main import build_parser, main
from autotune.core.config import MeasureSettings
from autotune.core.errors import ConfigError
from autotune.definition import settings
from autotune.definition.kinds import DURATION, Whole
from autotune.definition.settings import declared, setting
from autotune.definition.studydef import StudyDefinition

#: Settings that only a study definition file holds (no flag).
FILE_ONLY = {"description", "measure"}
#: StudyDefinition's fields that are no setting: its name (the file's stem) and where it was read.
NOT_SETTINGS = {"name", "origin", "command"}  # command: only after -- on the command line


def run_help(capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    return flat(capsys.readouterr().out)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_every_setting_has_one_key_one_flag_and_one_line_of_help():
    decl = declared(StudyDefinition)
    assert set(decl) == {f.name for f in fields(StudyDefinition)} - NOT_SETTINGS
    keys = [s.key for s in decl.values()]
    flags = [s.flag for s in decl.values() if s.flag]
    assert len(set(keys)) == len(keys) and len(set(flags)) == len(flags)
    for name, s in decl.items():
        assert s.help and "\n" not in s.help, name
        assert bool(s.flag) == (name not in FILE_ONLY), name
        assert s.flag is None or re.fullmatch(r"--[a-z][a-z-]+", s.flag), s.flag
    # the keys people know, under the fields the code reads
    assert decl["budget_s"].key == "budget" and decl["budget_s"].flag == "--budget"
    assert decl["trainer_options"].flag == "--trainer-option"


def test_the_run_command_has_every_flag_and_shows_the_real_defaults(capsys):
    text = run_help(capsys)
    for s in declared(StudyDefinition).values():
        if s.flag:
            assert f" {s.flag} " in text or f" {s.flag}, " in text, s.flag
    assert "--validate-rounds R interleaved rounds" in text
    # what the budget decides is shown as such, not as a number it then changes
    assert "up to 10, when it has room (default: from the budget: 5 aimed for, 2 to 10)" in text
    assert "(default: from the budget: up to 3, fewer when it cannot hold them)" in text
    assert "(default: 5)" not in text and "(default: 3)" not in text
    assert "(default: 10m)" in text and "--budget DURATION" in text
    assert "HH:MM:SS (SLURM's 01:30:00); a bare number is seconds" in text
    assert "--no-free-batch" in text and "--no-allow-drift" in text
    assert "--objective throughput|throughput,memory " in text
    assert "{throughput,throughput,memory}" not in text


@pytest.mark.parametrize(
    "args, line",
    [
        (["--world-size", "0"], "--world-size: must be a whole number >= 1, got 0"),
        (["--validate-rounds", "1"], "--validate-rounds: must be a whole number >= 2, got 1"),
        (["--concurrent-trials", "0"], "--concurrent-trials: must be a whole number >= 1, got 0"),
        (["--world-size", "two"], "--world-size: must be a whole number >= 1, got 'two'"),
        (["--budget", "0s"], "--budget: a duration must be positive and finite, got '0s'"),
        (["--node-wait", "0"], "--node-wait: a duration must be positive and finite, got '0'"),
        (
            ["--drift-tolerance", "-1"],
            "--drift-tolerance: must be a relative difference above 0 and below 10",
        ),
        (["--trainer-option", "width"], "--trainer-option: write 'width' as KEY=VALUE"),
        (
            ["--objective", "throughput,memory", "--sampler", "cmaes"],
            "--sampler: cmaes optimises one objective",
        ),
    ],
)
def test_a_bad_flag_is_one_line_naming_the_flag_and_exit_2(
    args, line, capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    assert main(["run", "--study", "quick", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"autotune: error: {line}"), err
    assert not (tmp_path / "home").exists()


def write(tmp_path, text: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return str(path)


def test_a_bad_key_in_a_study_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path, "trainer: mlp\nworld_size: 0\n")
    with pytest.raises(ConfigError) as e:
        StudyDefinition.load(path)
    assert str(e.value) == f"study definition {path}: world_size must be a whole number >= 1, got 0"
    path = write(tmp_path, "trainer: mlp\nmeasure: {window_s: 0}\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: measure.window_s must be a positive number"):
        StudyDefinition.load(path)


def test_a_rule_of_two_settings_names_the_flag_given_else_the_file(tmp_path, capsys):
    path = write(tmp_path, "trainer: mlp\nsampler: cmaes\n")
    assert main(["run", "--study", path, "--objective", "throughput,memory"]) == 2
    assert capsys.readouterr().err.startswith(
        "autotune: error: --objective: throughput,memory needs a sampler of two objectives"
    )
    path = write(tmp_path, "trainer: mlp\nsampler: cmaes\nobjective: [throughput, memory]\n")
    with pytest.raises(ConfigError, match=r"mine.yaml: sampler cmaes optimises one objective"):
        StudyDefinition.load(path)


def test_flags_override_the_file_and_trainer_options_add_to_its_own(tmp_path):
    path = write(tmp_path, "trainer: mlp\ntrainer_options: {width: 8}\nfree_batch: true\n")
    d = StudyDefinition.load(path)
    p = argparse.ArgumentParser()
    settings.add_flags(p, StudyDefinition)
    args = p.parse_args(["--no-free-batch", "--trainer-option", "layers=2"])
    flags = settings.flag_values(args, StudyDefinition)
    assert flags == {"trainer_options": {"layers": 2}, "free_batch": False}
    o = d.override(**flags)
    assert o.trainer_options == {"width": 8, "layers": 2} and o.free_batch is False
    assert d.override(trainer="convnet").trainer_options == {}  # mlp's options are not its own
    assert d.override().trainer_options == {"width": 8}


def test_a_definition_made_in_code_is_checked_too():
    with pytest.raises(ConfigError, match=r"validate_rounds must be a whole number >= 2, got 1"):
        StudyDefinition(name="t", validate_rounds=1)
    with pytest.raises(ConfigError, match=r"max_windows must be a whole number >= min_windows"):
        MeasureSettings(min_windows=4, max_windows=3)
    assert StudyDefinition(name="t").validate_rounds == 5


@dataclass(frozen=True, kw_only=True)
class Extended(StudyDefinition):
    """A definition with one setting more, declared as every setting is."""

    warmup_budget_s: float = setting(
        30.0, DURATION, key="warmup_budget", help="time the warm-up may take"
    )
    retries: int | None = setting(None, Whole(low=0), unset="as many as fit", help="retries")


def test_a_setting_declared_once_is_a_file_key_and_a_flag():
    p = argparse.ArgumentParser()
    settings.add_flags(p, Extended)
    assert "time the warm-up may take (default: 30s)" in flat(p.format_help())
    args = p.parse_args(["--warmup-budget", "2m", "--retries", "3"])
    assert settings.flag_values(args, Extended) == {"warmup_budget_s": 120.0, "retries": 3}

    d = settings.from_mapping(
        Extended, {"trainer": "mlp", "warmup_budget": "90s"}, where="study definition x", name="x"
    )
    assert d.warmup_budget_s == 90.0 and d.retries is None
    with pytest.raises(ConfigError, match=r"^study definition x: retries must be a whole number"):
        settings.from_mapping(
            Extended, {"trainer": "mlp", "retries": -1}, where="study definition x", name="x"
        )
    with pytest.raises(ConfigError, match=r"^--retries: must be a whole number >= 0, got -1"):
        settings.flag_values(p.parse_args(["--retries", "-1"]), Extended)
    with pytest.raises(ConfigError, match=r"^study definition x: unknown key 'warmup'"):
        settings.from_mapping(Extended, {"warmup": 1}, where="study definition x", name="x")


def test_the_commands_of_every_cli_module_are_registered():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = {"run", "export", "report", "dashboard", "env", "launch", "lab", "spaces"}
    assert commands | {"trainers", "studies"} <= set(sub.choices)
