"""The ``autotune`` command: run, export, report, dashboard, env, launch, lab, and listings of
spaces, trainers and studies.

Bad input is one line on stderr naming the thing and the fix, exit code 2, nothing written.
This module holds ``main`` (errors and exit codes) and ``autotune run``, whose setting flags are
generated from ``autotune.definition.settings``; the other commands live in ``cli.stored`` (commands
that
read a stored study) and ``cli.tools`` (profiles, the network lab, listings).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from autotune.cli import grammar
from autotune.cli import stored as cli_stored
from autotune.cli import tools as cli_tools
from autotune.cli.stored import default_run_dir
from autotune.core.errors import (
    AutotuneError,
    BaselineFailed,
    ConfigError,
    Terminated,
    interrupted_by,
    raise_terminated,
)
from autotune.core.values import terminal_safe
from autotune.definition import settings
from autotune.definition.studydef import StudyDefinition
from autotune.script.compare import add_compare_parser

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "Parser", "build_parser", "default_run_dir", "main"]

#: When the command started (this module is imported first): ``autotune run``'s budget counts
#: from here, Ray's start and the placement included.
STARTED = time.monotonic()
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
TERMINATED_LINE = "terminated (SIGTERM)"


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line and exit 2, like every bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"autotune: error: {message} (see {self.prog} --help)\n")


DESCRIPTION = (
    "Tune the throughput of a PyTorch DDP job: an Optuna study of short, real DDP trials "
    "launched through Ray, measured against PyTorch's defaults, exported as a YAML profile "
    "that your training script applies."
)


def version_line() -> str:
    """``autotune --version``: this release and the versions a bug report needs."""
    from importlib.metadata import PackageNotFoundError, version

    import autotune

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    parts = ", ".join(f"{d} {of(d)}" for d in ("torch", "optuna", "ray"))
    return f"autotune {autotune.__version__} ({autotune.DISTRIBUTION}; {parts})"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="autotune", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="print the release and the versions a bug report needs, and exit",
    )
    p.set_defaults(action=grammar.print_help_of(p))  # bare `autotune`: the help, exit 0
    sub = p.add_subparsers(
        dest="command",
        title="commands",
        metavar="COMMAND",
        parser_class=Parser,
        help="`autotune COMMAND --help` describes one",
    )
    _add_run(sub)
    cli_stored.add_commands(sub)
    cli_tools.add_commands(sub)
    add_compare_parser(sub)
    return p


EPILOG = (
    "--study names a study definition (a file in studies/ or a YAML file) and --study-name a "
    "stored study; -o/--output is what a command writes. (report and dashboard still take "
    "--study for --study-name for one release.)"
)


def _add_run(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="tune a DDP workload and export the best profile",
        description="Tune a DDP workload and export the best profile.",
    )
    r.add_argument(
        "--study",
        default="default",
        metavar="NAME|FILE",
        help="study definition: a name from studies/ or a YAML file (default: default)",
    )
    settings.add_flags(
        r.add_argument_group(
            "settings",
            "Each flag overrides the study definition's key of the same name (dashes for "
            "underscores; --trainer-option adds to trainer_options). A default shown applies "
            "where the study definition leaves the key out.",
        ),
        StudyDefinition,
    )
    _add_where(r.add_argument_group("where and how it runs"))
    r.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="script mode: -- CMD ... runs your own training command as each trial (e.g. -- "
        "torchrun --nproc-per-node 2 train.py); needs --global-batch",
    )
    r.set_defaults(action=cmd_run)


def _add_where(out: Any) -> None:
    """``run``'s flags of where it runs and writes: the study's name and storage, the run
    directory, the Ray cluster, the profile's path, the display."""
    out.add_argument(
        "--study-name",
        metavar="NAME",
        help="Optuna study name (default: derived from the study "
        "definition, trainer, backend and world size); an existing one is resumed",
    )
    out.add_argument("--storage", metavar="URL", help=grammar.STORAGE_HELP)
    out.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where the database and profiles go (default: $AUTOTUNE_HOME or ~/.autotune)",
    )
    out.add_argument(
        "--address",
        metavar="auto|HOST:PORT",
        help="join this Ray cluster instead of starting a local instance: auto (the cluster "
        "`ray start` runs on this machine) or its GCS address HOST:PORT (e.g. 10.0.0.1:6379); "
        "without it, RAY_ADDRESS is read the same way (`ray job submit` sets it). Ray Client "
        "(ray://) and the dashboard's http://HOST:8265 are refused, naming the form to use",
    )
    grammar.add_output(
        out,
        "where to write the profile YAML (default: RUN_DIR/profiles/STUDY_NAME.yaml)",
        old=("--profile",),
    )
    out.add_argument(
        "--log-to",
        action="append",
        default=[],
        metavar="TRACKER",
        help="also record each trial and the run's result in mlflow, wandb or tensorboard "
        "(repeatable or comma-separated; docs/trackers.md)",
    )
    out.add_argument(
        "--quiet",
        action="store_true",
        help="no live display: one plain line per trial, for logs (also when stdout is "
        "not a terminal)",
    )


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from autotune.launch.address import check_address
    from autotune.report.progress import RunView
    from autotune.tuner import RunRequest, run

    flags = settings.flag_values(args, StudyDefinition)  # errors name the flag
    d = StudyDefinition.load(args.study).override(**flags)
    if args.cmd:
        if args.cmd[0] != "--" or len(args.cmd) < 2:
            raise ConfigError(
                f"autotune run: unexpected {args.cmd[0]!r}; a command goes after --: "
                "autotune run [options] -- CMD ..."
            )
        d = dataclasses.replace(d, command=tuple(args.cmd[1:]))
    check_address(args.address)  # ray:// and http://: refused before anything starts
    # A terminal gets the live display; --quiet or a log file gets plain lines.
    console = Console(force_terminal=False) if args.quiet else Console()
    req = RunRequest(
        definition=d,
        run_dir=(args.run_dir or default_run_dir()).expanduser().absolute(),
        study_name=args.study_name,
        storage_url=args.storage,
        address=args.address,
        profile_path=args.output,
        log_to=args.log_to,
        sigterm=True,
        started=STARTED,
    )
    # SIGTERM (SLURM preemption, `timeout`, `docker stop`) stops the run like Ctrl-C does, and
    # it exits 143 at every step: run() holds it while Ray starts and from the export on.
    Terminated.received = False
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        with RunView(console, budget_s=d.budget_s) as view:
            summary = run(req, emit=_with_plan(view, d))
        _print_summary(console, summary)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if summary.interrupted or Terminated.received:
        terminated = summary.terminated or Terminated.received
        print(f"autotune: {TERMINATED_LINE if terminated else 'interrupted'}", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    if summary.stopped:
        print(f"autotune: stopped early: {terminal_safe(summary.stopped)}", file=sys.stderr)
        return 1
    return 0


def _with_plan(view: Any, d: StudyDefinition) -> Any:
    """``view``, which also shows the re-validation's plan once the study is open."""
    from autotune.core.events import Note, StudyOpened

    def emit(event: Any) -> None:
        view(event)
        if isinstance(event, StudyOpened):
            view(Note(validation_line(d)))

    return emit


def validation_line(d: StudyDefinition) -> str:
    """The re-validation the run plans, as the budget will fit it: said at the start, since
    the numbers shown as defaults are what is aimed for, not what is run."""
    from autotune.definition.durations import format_duration
    from autotune.search.budget import MAX_ROUNDS

    if d.multi_objective:
        return "Re-validation: none (throughput,memory: the profile is chosen from the front)"
    if d.validate_top == 0:
        return "Re-validation: none (--validate-top 0: the search's best is exported as is)"
    return (
        f"Re-validation: up to {d.validate_top} candidates x {d.validate_rounds} rounds against "
        f"the baseline, fitted to a third of the {format_duration(d.budget_s)} budget once a "
        f"trial's time is known (fewer when short, up to {MAX_ROUNDS} rounds when it has room)"
    )


def _exported_line(path: Path) -> str:
    """What the exported profile says, in one line: the speedup it stands for and on what."""
    from autotune.profile.profile import Profile

    return Profile.load(path).headline()


def _print_summary(console: Any, summary: Any) -> None:
    from autotune.core.values import number, speedup
    from autotune.limit.probe import summary_line
    from autotune.record.attrs import LimitRecord, StopRecord, ValidationRecord, load_readable
    from autotune.record.storage import display_url
    from autotune.report.progress import failure_line, summary_table
    from autotune.search.budget import budget_line

    def say(text: str) -> None:
        console.print(terminal_safe(text), highlight=False, soft_wrap=True, markup=False)

    t = summary.trials
    say("")
    if summary.study is not None and t.get("complete"):
        console.print(summary_table(summary.study))
    say(
        f"Study      {summary.study_name}: {t.get('complete', 0)} complete, "
        f"{t.get('failed', 0)} failed, {t.get('pruned', 0)} pruned"
    )
    failed = None if summary.study is None else failure_line(summary.study)
    if failed:
        say(failed)
    if summary.baseline and summary.best:
        say(
            f"Search     baseline {number(summary.baseline)} samples/s, best single trial "
            f"{number(summary.best)} samples/s ({speedup(summary.best / summary.baseline)})"
        )
    stop = None if summary.study is None else load_readable(summary.study, StopRecord)
    if stop is not None:
        say(f"Stopped    {stop.line().removeprefix('Search stopped ')}")
    if summary.ledger:
        say(f"Budget     {budget_line(summary.budget_s, summary.ledger)}")
    if summary.profile_path:
        say(f"Exported   {_exported_line(summary.profile_path)}")
    checked = None if summary.study is None else load_readable(summary.study, ValidationRecord)
    if checked is not None and checked.as_is is not None:  # the user's job as it runs today
        knobs = checked.speedup if checked.beats_baseline else None
        say(f"As today   {checked.as_is.line(knobs)}")
    limit = None if summary.study is None else load_readable(summary.study, LimitRecord)
    if limit is not None and (line := summary_line(limit.probes())):
        say(f"Limit      {line.removeprefix('Limit: ')}")
    say(f"Storage    {display_url(summary.storage_url)}")
    if summary.profile_path:
        say(f"Profile    {summary.profile_path}")
    say(f"Dashboard  optuna-dashboard {display_url(summary.storage_url)}")
    say(f"Report     autotune report --study-name {summary.study_name}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = _act(args)
    if argv is None and args.command == "run":
        # The run is over and has said how it ended: a Ctrl-C or SIGTERM while the interpreter
        # exits (Ray's exit handlers, the modules' teardown) changes nothing. Python's exit gives
        # a signal its default action back early, and the process would end by the signal.
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
    return code


def _act(args: argparse.Namespace) -> int:
    """Run the command; its errors become one line and an exit code."""
    try:
        return args.action(args)
    except ConfigError as e:
        print(f"autotune: error: {terminal_safe(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except BaselineFailed as e:
        print(f"autotune: {terminal_safe(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        if interrupted_by(e) == "SIGTERM":
            print(f"autotune: {TERMINATED_LINE}", file=sys.stderr)
            return EXIT_TERMINATED
        print("autotune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `autotune spaces | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except AutotuneError as e:
        print(f"autotune: {terminal_safe(str(e))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
