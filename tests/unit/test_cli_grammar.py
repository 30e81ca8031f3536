"""One grammar for every ``autotune`` command (``autotune.cli.grammar``): ``--study`` is a study
definition and ``--study-name`` a stored study everywhere, ``-o/--output`` is every path a
command writes, every flag and positional says what it is, a bare command prints its help, a
renamed flag keeps its old spelling for a release (with one deprecation line), and the
addresses that join no Ray cluster are refused naming the form to use, before Ray starts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from autotune.cli.main import build_parser, validation_line
from autotune.definition.studydef import StudyDefinition
from tests.conftest import console_script, in_process
from tests.unit.test_report_and_progress import one_study


def parsers(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command line, by its words (``autotune lab up``), depth first."""
    out = [(" ".join(("autotune", *path)), p)]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += parsers(sub, (*path, name))
    return out


ALL = parsers(build_parser())


def test_every_command_was_found():
    names = {name for name, _ in ALL}
    assert {"autotune run", "autotune export", "autotune lab up", "autotune lab exec"} <= names


@pytest.mark.parametrize("name, parser", ALL, ids=[name for name, _ in ALL])
def test_every_flag_and_positional_of_every_command_says_what_it_is(name, parser):
    for action in parser._actions:
        what = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"{name} {what}: no help"
        assert action.help != argparse.SUPPRESS, f"{name} {what}: hidden"
    if isinstance(parser, argparse.ArgumentParser) and name != "autotune":
        parent, _, last = name.rpartition(" ")
        (subs,) = [
            a for a in dict(ALL)[parent]._actions if isinstance(a, argparse._SubParsersAction)
        ]
        helps = {c.dest: c.help for c in subs._choices_actions}
        assert helps.get(last), f"{name}: no one-line help in {parent} --help"


def options_of(name: str) -> dict[str, argparse.Action]:
    return {o: a for a in dict(ALL)[name]._actions for o in a.option_strings}


def test_study_is_a_definition_and_study_name_a_stored_study_everywhere():
    readers = {"autotune export", "autotune report", "autotune dashboard"}
    for name, _ in ALL:
        opts = options_of(name)
        if "--study-name" in opts:
            assert opts["--study-name"].dest == "study_name", name
        if "--study" not in opts:
            continue
        if name in readers:  # its old spelling there, deprecated
            assert opts["--study"] is opts["--study-name"], name
        else:  # a study definition
            assert opts["--study"].dest == "study" and "definition" in opts["--study"].help, name
    assert options_of("autotune run")["--study"].default == "default"
    # every command that reads a study takes its name the same way, and finds the only one
    for name in readers:
        assert not options_of(name)["--study-name"].required, name


def test_every_command_that_writes_a_file_takes_o_and_output():
    for name in ("autotune run", "autotune export", "autotune report"):
        opts = options_of(name)
        assert opts["-o"] is opts["--output"] and opts["-o"].dest == "output", name
    assert "--profile" not in {o for n, _ in ALL if n != "autotune run" for o in options_of(n)}


@pytest.mark.parametrize("run", [in_process, console_script], ids=["in process", "console"])
def test_bare_autotune_prints_its_help_and_exits_0(run, tmp_path):
    p = run(cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.startswith("usage: autotune") and "run " in p.stdout
    assert "--study names a study definition" in " ".join(p.stdout.split())
    lab = in_process("lab", cwd=tmp_path)
    assert lab.returncode == 0 and lab.stdout.startswith("usage: autotune lab")
    assert list(tmp_path.iterdir()) == []


def test_export_finds_the_only_study_as_report_does(tmp_path):
    url = one_study(tmp_path / "one.db", "s")
    p = in_process("export", "--storage", url, cwd=tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    named = in_process("export", "--storage", url, "--study-name", "s", cwd=tmp_path)
    assert p.stdout == named.stdout and "version:" in p.stdout
    # two studies: the same one-line error for both commands, naming them and the flag
    url = one_study(tmp_path / "two.db", "a", "b")
    for command, verb in (("export", "export"), ("report", "report")):
        p = in_process(command, "--storage", url, "-o", str(tmp_path / "out"), cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert re.match(
            rf"autotune: error: --study-name: .*two.db holds 2 studies \(a, b\); name the one "
            rf"to {verb} with --study-name NAME",
            p.stderr,
        ), p.stderr
        assert not (tmp_path / "out").exists()


def deprecation(option: str, new: str) -> str:
    return f"autotune: deprecated: {option} is now {new}; the old spelling goes in the next release"


def test_old_spellings_still_work_and_say_they_are_deprecated(tmp_path):
    url = one_study(tmp_path / "one.db", "s")
    # report's and dashboard's --study NAME (now --study-name), and so export's: it works, and
    # one line says so
    p = in_process("export", "--study", "s", "--storage", url, "-o", str(tmp_path / "p.yaml"))
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [deprecation("--study", "--study-name")]
    assert (tmp_path / "p.yaml").exists()
    for command in ("report", "dashboard"):
        assert build_parser().parse_args([command, "--study", "s"]).study_name == "s"
    # run --profile FILE (now -o/--output): the same destination, checked as --output
    p = in_process(
        "run",
        "--study",
        "quick",
        "--profile",
        str(tmp_path),
        cwd=tmp_path,
        env={"AUTOTUNE_HOME": str(tmp_path / "home")},
    )
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and lines[0] == deprecation("--profile", "-o/--output")
    assert lines[1].startswith(f"autotune: error: --output {tmp_path}") and len(lines) == 2
    args = build_parser().parse_args(["run", "--profile", "p.yaml"])
    assert args.output == Path("p.yaml")
    # the new spellings say nothing more
    args = build_parser().parse_args(["dashboard", "--study-name", "s"])
    assert args.study_name == "s"


@pytest.mark.parametrize(
    "address, says",
    [
        ("ray://10.0.0.1:10001", "Ray Client is not supported"),
        ("http://10.0.0.1:8265", "that is the Ray dashboard's address"),
        ("https://ray.example.org:8265/", "that is the Ray dashboard's address"),
    ],
)
@pytest.mark.parametrize("given", ["flag", "RAY_ADDRESS"])
def test_addresses_that_join_no_cluster_are_refused_before_ray_starts(
    address, says, given, tmp_path
):
    env = {"AUTOTUNE_HOME": str(tmp_path / "home")}
    args = ["run", "--study", "quick", "--budget", "1m"]
    if given == "flag":
        args += ["--address", address]
        name, use = f"--address {address}", "--address"
    else:
        env["RAY_ADDRESS"] = address
        name, use = f"RAY_ADDRESS={address}", "RAY_ADDRESS="
    host = re.sub(r"^\w+://([^:/]+).*", r"\1", address)
    p = in_process(*args, cwd=tmp_path, env=env)  # ray.init fails this test if reached
    assert p.returncode == 2 and p.stdout == "", p.stdout
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"autotune: error: {name}: {says}"), p.stderr
    assert f"({use}{' ' if given == 'flag' else ''}{host}:6379)" in p.stderr, p.stderr
    assert "ray job submit --address http" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_address_help_names_ray_address_and_the_forms():
    text = " ".join(options_of("autotune run")["--address"].help.split())
    assert "RAY_ADDRESS" in text and "auto" in text and "HOST:PORT" in text
    assert "ray://" in text and "http://HOST:8265" in text


def test_the_budget_help_says_hh_mm_ss_and_bare_seconds():
    text = options_of("autotune run")["--budget"].help
    assert "HH:MM:SS" in text and "a bare number is seconds" in text


def test_the_run_says_its_re_validation_plan_instead_of_defaults_the_budget_changes():
    d = StudyDefinition.load("default")
    line = validation_line(d.override(budget_s=7200.0))
    assert line.startswith("Re-validation: up to 3 candidates x 5 rounds against the baseline")
    assert "a third of the 2h budget" in line and "up to 10 rounds" in line
    assert "none (--validate-top 0" in validation_line(d.override(validate_top=0))
    multi = validation_line(d.override(objective="throughput,memory"))
    assert multi.startswith("Re-validation: none") and "front" in multi
    top = options_of("autotune run")["--validate-top"].help
    rounds = options_of("autotune run")["--validate-rounds"].help
    assert "(default: from the budget" in top and "(default: from the budget" in rounds
