"""The ``autotune`` command: run, export, report, dashboard, env, launch, lab, and listings of
spaces, trainers and studies.

Bad input is one line on stderr naming the thing and the fix, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from autotune.durations import parse_duration, parse_size_mb
from autotune.errors import AutotuneError, BaselineFailed, ConfigError
from autotune.studydef import PLACEMENTS

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def default_run_dir() -> Path:
    """Where run outputs go: $AUTOTUNE_HOME, else ~/.autotune (never the source tree)."""
    return Path(os.environ.get("AUTOTUNE_HOME") or Path.home() / ".autotune")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(
            EXIT_USAGE,
            f"autotune: error: {message} (see autotune {self.prog.split()[-1]} --help)\n",
        )


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="tune a DDP workload and export the best profile")
    r.add_argument(
        "--study",
        default="default",
        help="study definition: a name from studies/ or a YAML file (default: default)",
    )
    r.add_argument("--space", help="search space: a name from search_spaces/ or a YAML file")
    r.add_argument(
        "--budget",
        help="wall-clock time this invocation may launch trials for, "
        "e.g. 90s, 10m, 2h, 1h30m. Per invocation: running the command again "
        "resumes the same study with a fresh budget and keeps its trials",
    )
    r.add_argument("--trainer", help="built-in trainer name or package.module:function")
    r.add_argument(
        "--trainer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword option for the trainer (repeatable), e.g. width=1024",
    )
    r.add_argument("--world-size", type=int, help="DDP ranks per trial")
    r.add_argument("--backend", choices=("auto", "gloo", "nccl"))
    r.add_argument("--sampler", help="tpe (default), gp, random, cmaes or grid")
    r.add_argument(
        "--objective",
        choices=("throughput", "throughput,memory"),
        help="throughput (default), or throughput,memory: a Pareto front of samples/s and "
        "peak memory per rank, the profile chosen from it by a stated rule",
    )
    r.add_argument("--seed", type=int, help="sampler and data seed")
    r.add_argument(
        "--trial-timeout",
        help="kill a trial after this long (default: 4x the "
        "baseline trial's duration, at least 30s)",
    )
    r.add_argument(
        "--study-name",
        help="Optuna study name (default: derived from the study "
        "definition, trainer, backend and world size); an existing one is resumed",
    )
    r.add_argument("--storage", help="Optuna RDB URL (default: sqlite in the run directory)")
    r.add_argument(
        "--run-dir",
        type=Path,
        help="where the database and profiles go (default: $AUTOTUNE_HOME or ~/.autotune)",
    )
    r.add_argument(
        "--address",
        help="join this Ray cluster (auto or HOST:PORT) instead of starting a local instance",
    )
    r.add_argument(
        "--placement",
        choices=PLACEMENTS,
        help="how one trial's ranks are placed on the cluster's nodes (Ray placement-group "
        "strategy; default pack: as few nodes as possible; spread: one rank per node where "
        "it can)",
    )
    r.add_argument(
        "--concurrent-trials",
        type=int,
        metavar="N",
        help="trials measured at once, each in its own placement group (default: as many as "
        "the cluster holds with every rank owning its share of a node's CPUs; 1 on one "
        "machine)",
    )
    r.add_argument(
        "--profile",
        type=Path,
        help="where to write the profile YAML (default: RUN_DIR/profiles/STUDY_NAME.yaml)",
    )
    r.add_argument(
        "--max-memory",
        help="peak host memory per rank, e.g. 4GiB; a trial over it fails with reason oom",
    )
    r.add_argument(
        "--validate-top",
        type=int,
        metavar="K",
        help="re-measure the K best configurations against the baseline, interleaved, and "
        "choose the profile from those numbers (default 3; 0: export the best trial as is)",
    )
    r.add_argument(
        "--validate-rounds",
        type=int,
        metavar="R",
        help="interleaved rounds of that re-measurement (default 3)",
    )
    r.add_argument(
        "--free-batch",
        action="store_true",
        default=None,
        help="let the tuner change the global batch (the per-rank batch becomes a knob); "
        "training dynamics change, and the profile says so",
    )
    r.add_argument(
        "--allow-drift",
        action="store_true",
        default=None,
        help="keep settings whose loss drifts from the fp32 baseline's beyond the tolerance "
        "(reduced precision, compression); by default they are FAIL numerics_drift",
    )
    r.add_argument(
        "--quiet",
        action="store_true",
        help="no live display: one plain line per trial, for logs (also when stdout is "
        "not a terminal)",
    )

    e = sub.add_parser("export", help="write the best profile of an existing study")
    e.add_argument("--study-name", required=True)
    e.add_argument("--storage", help="Optuna RDB URL (default: sqlite in the run directory)")
    e.add_argument("--run-dir", type=Path)
    e.add_argument("-o", "--output", type=Path, help="profile path (default: stdout)")
    e.add_argument(
        "--trial",
        type=int,
        metavar="N",
        help="export COMPLETE trial N instead of the chosen one (e.g. another Pareto point)",
    )

    v = sub.add_parser("env", help="print a profile's environment as shell export lines")
    v.add_argument("profile", type=Path)

    la = sub.add_parser(
        "launch",
        help="run a command with a profile's environment applied",
        usage="autotune launch PROFILE -- COMMAND [ARGS...]",
    )
    la.add_argument("profile", type=Path)
    la.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")

    db = sub.add_parser("dashboard", help="open the study storage in optuna-dashboard")
    _study_source(db, "print the address of this study's page (the server shows every study)")
    db.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    db.add_argument("--port", type=int, default=8080)

    rp = sub.add_parser("report", help="write an HTML report and PNG figures of a study")
    _study_source(rp, "the study (default: the only study in the storage)")
    rp.add_argument(
        "-o",
        "--output",
        type=Path,
        help="directory for report.html and the PNGs (default: RUN_DIR/reports/STUDY_NAME)",
    )

    lab = sub.add_parser(
        "lab", help="a multi-node Ray cluster on this machine: namespaces and a shaped link"
    )
    lab_sub = lab.add_subparsers(dest="lab_command", required=True, parser_class=_Parser)
    lu = lab_sub.add_parser("up", help="build the lab and start Ray on every node (root)")
    lu.add_argument("--nodes", type=int, default=2, help="Ray nodes, one namespace each (2)")
    lu.add_argument("--rate", default="1gbit", help="each node's link, as tc writes it (1gbit)")
    lu.add_argument(
        "--cpus-per-node",
        type=int,
        help="CPUs each Ray node offers (default: this machine's cores / nodes)",
    )
    lab_sub.add_parser("down", help="stop the lab's processes and delete its namespaces")
    lab_sub.add_parser("status", help="what exists of the lab")
    le = lab_sub.add_parser(
        "exec", help="run a command in a node's namespace, RAY_ADDRESS set to the lab's head"
    )
    le.add_argument("--node", type=int, default=0, help="which node's namespace (0: the head)")
    le.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    sub.add_parser("spaces", help="list the built-in search spaces and the knobs they may use")
    sub.add_parser("trainers", help="list the built-in trainers")
    sub.add_parser("studies", help="list the built-in study definitions")
    return p


def _study_source(p: argparse.ArgumentParser, study_help: str) -> None:
    """--study-name (alias --study), --storage and --run-dir: which study, where."""
    p.add_argument("--study-name", "--study", dest="study_name", help=study_help)
    p.add_argument("--storage", help="Optuna RDB URL (default: sqlite in the run directory)")
    p.add_argument("--run-dir", type=Path)


def _trainer_options(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--trainer-option {item!r}: write it as KEY=VALUE, e.g. width=1024")
        out[key] = yaml.safe_load(value)
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from autotune.progress import RunView
    from autotune.studydef import StudyDefinition
    from autotune.tuner import RunRequest, run

    if args.concurrent_trials is not None and args.concurrent_trials < 1:
        raise ConfigError(f"--concurrent-trials: must be at least 1, got {args.concurrent_trials}")
    d = StudyDefinition.load(args.study)
    options = _trainer_options(args.trainer_option)
    if not args.trainer or args.trainer == d.trainer:
        options = {**d.trainer_options, **options}  # else they belong to the other trainer
    d = d.override(
        space=args.space,
        budget_s=None if args.budget is None else parse_duration(args.budget),
        trainer=args.trainer,
        trainer_options=options,
        world_size=args.world_size,
        backend=args.backend,
        sampler=args.sampler,
        seed=args.seed,
        max_memory_mb=None if args.max_memory is None else parse_size_mb(args.max_memory),
        validate_top=args.validate_top,
        validate_rounds=args.validate_rounds,
        allow_drift=args.allow_drift,
        free_batch=args.free_batch,
        objective=args.objective,
        placement=args.placement,
        concurrent_trials=args.concurrent_trials,
        trial_timeout_s=(
            None
            if args.trial_timeout is None
            else parse_duration(args.trial_timeout, what="--trial-timeout")
        ),
    )
    if args.world_size is not None and args.world_size < 1:
        raise ConfigError(f"--world-size: must be at least 1, got {args.world_size}")
    # A terminal gets the live display; --quiet or a log file gets plain lines.
    console = Console(force_terminal=False) if args.quiet else Console()
    req = RunRequest(
        definition=d,
        run_dir=(args.run_dir or default_run_dir()).expanduser().absolute(),
        study_name=args.study_name,
        storage_url=args.storage,
        address=args.address,
        profile_path=args.profile,
    )
    with RunView(console, budget_s=d.budget_s) as view:
        summary = run(req, view=view)
    _print_summary(console, summary)
    if summary.interrupted:
        return EXIT_INTERRUPTED
    if summary.stopped:
        print(f"autotune: stopped early: {summary.stopped}", file=sys.stderr)
        return 1
    return 0


def _load_study(url: str, name: str) -> Any:
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=url)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(url)]
        raise ConfigError(
            f"--study-name {name}: no such study in {url}; it has {', '.join(names) or 'none'}"
        ) from None


def _study_id(url: str, name: str) -> int:
    """The study's id in the storage: optuna-dashboard's address of its page."""
    import optuna

    _load_study(url, name)  # the error naming the studies there
    return optuna.storages.get_storage(url).get_study_id_from_name(name)


def _exported_line(path: Path) -> str:
    """What the exported profile says, in one line: the speedup it stands for and on what."""
    from autotune.profile import Profile

    m = Profile.load(path).measured
    speedup, ci = m.get("speedup"), m.get("speedup_interval")
    if m.get("validation") and ci:
        if ci == [1.0, 1.0]:
            return "the defaults: no candidate beat them beyond the noise in the re-validation"
        return f"{speedup:.2f}x the defaults, re-validated (95 % interval {ci[0]:.2f}-{ci[1]:.2f}x)"
    return f"{speedup:.2f}x the defaults ({m.get('note', 'not re-validated')})"


def _print_summary(console: Any, summary: Any) -> None:
    from autotune.progress import failure_line, summary_table

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True, markup=False)

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
            f"Search     baseline {summary.baseline:.1f} samples/s, best single trial "
            f"{summary.best:.1f} samples/s ({summary.best / summary.baseline:.2f}x)"
        )
    if summary.profile_path:
        say(f"Exported   {_exported_line(summary.profile_path)}")
    say(f"Storage    {summary.storage_url}")
    if summary.profile_path:
        say(f"Profile    {summary.profile_path}")
    say(f"Dashboard  optuna-dashboard {summary.storage_url}")
    say(f"Report     autotune report --study-name {summary.study_name}")


def _cmd_export(args: argparse.Namespace) -> int:
    from autotune.tuner import export_profile, study_profile

    study = _load_study(_storage_url(args), args.study_name)
    if args.output:
        print(export_profile(study, args.output, trial=args.trial))
    else:
        sys.stdout.write(study_profile(study, trial=args.trial).to_yaml())
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    import shlex

    from autotune.profile import Profile

    profile = Profile.load(args.profile)
    for key, value in profile.env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _command(words: list[str]) -> list[str]:
    """The command after ``--`` (``autotune launch P -- CMD``, ``autotune lab exec -- CMD``)."""
    return words[1:] if words[:1] == ["--"] else words


def _cmd_launch(args: argparse.Namespace) -> int:
    import subprocess

    from autotune.profile import Profile

    cmd = _command(args.cmd)
    if not cmd:
        raise ConfigError("autotune launch: no command; write autotune launch PROFILE -- CMD ...")
    profile = Profile.load(args.profile)
    for diff in profile.hardware_differences():
        print(f"autotune: warning: measured on other hardware: {diff}", file=sys.stderr)
    try:
        return subprocess.call(cmd, env={**os.environ, **profile.env})
    except FileNotFoundError:
        raise ConfigError(f"autotune launch: no such command {cmd[0]!r}") from None


def _storage_url(args: argparse.Namespace) -> str:
    """The storage a command reads: --storage, else the run directory's SQLite file, which
    must exist (nothing is created by a command that only reads)."""
    from autotune import storage as storage_mod

    url = args.storage or storage_mod.default_url(
        (args.run_dir or default_run_dir()).expanduser().absolute()
    )
    storage_mod.check_url(url, must_exist=True)
    return url


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from optuna_dashboard import run_server

    url = _storage_url(args)
    page = f"http://{args.host}:{args.port}/dashboard/"
    if args.study_name:
        page += f"studies/{_study_id(url, args.study_name)}"
    print(f"optuna-dashboard for {url} at {page} (Ctrl-C stops it)", flush=True)
    run_server(url, host=args.host, port=args.port)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    import optuna

    from autotune import report

    url = _storage_url(args)
    name = args.study_name
    if name is None:
        names = [s.study_name for s in optuna.get_all_study_summaries(url)]
        if len(names) != 1:
            raise ConfigError(
                f"--study-name: {url} holds {len(names)} studies "
                f"({', '.join(names) or 'none'}); name the one to report"
            )
        name = names[0]
    study = _load_study(url, name)
    if not study.trials:
        raise ConfigError(f"--study-name {name}: the study has no trials yet; run it first")
    out = args.output or (args.run_dir or default_run_dir()).expanduser() / "reports" / name
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {out}: exists and is not a directory")
    for path in report.write(report.build(study), out):
        print(path)
    return 0


def _cmd_spaces(args: argparse.Namespace) -> int:
    from autotune.knobs import KNOBS
    from autotune.space import SearchSpace, available_spaces

    for name in available_spaces():
        s = SearchSpace.load(name)
        print(f"{name:10} {s.description}")
    print("\nknobs a space may use (section.name: what it does):")
    for k in KNOBS.values():
        print(f"  {k.section}.{k.name}: {k.doc}")
    return 0


def _cmd_trainers(args: argparse.Namespace) -> int:
    from autotune.workload import available_trainers

    for name, doc in available_trainers().items():
        print(f"{name:12} {doc}")
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    from autotune import netlab

    if args.lab_command == "up":
        lab = netlab.up(nodes=args.nodes, rate=args.rate, cpus_per_node=args.cpus_per_node)
        ips = ", ".join(netlab.node_ip(i) for i in range(lab.nodes))
        print(
            f"lab up: {lab.nodes} Ray nodes ({ips}, {lab.cpus_per_node} CPU each), "
            f"every link shaped to {lab.rate}"
        )
        print(f"head    {lab.address} (namespace {netlab.node_ns(0)})")
        print("run     autotune lab exec -- autotune run --address auto --study lab")
        print("down    autotune lab down")
        return 0
    if args.lab_command == "down":
        netlab.check_host()
        gone = netlab.down()
        print(f"lab down: deleted {', '.join(gone)}" if gone else "lab down: no lab was up")
        return 0
    if args.lab_command == "status":
        netlab.check_host()
        st = netlab.status()
        if not st["namespaces"]:
            print("no lab is up")
            return 0
        lab = st["lab"]
        if lab is None:
            print(
                f"debris of a lab (no record): {', '.join(st['namespaces'])}; run autotune lab down"
            )
        else:
            print(f"lab: {lab['nodes']} nodes, {lab['rate']}, head {st['address']}")
        for n in st["nodes"]:
            print(
                f"  {n['namespace']:9} {n['address']:12} {n['processes']:3} processes  {n['qdisc']}"
            )
        return 0
    cmd = _command(args.cmd)
    return netlab.exec_in(cmd, node=args.node)


def _cmd_studies(args: argparse.Namespace) -> int:
    from autotune.studydef import StudyDefinition, available_studies

    for name in available_studies():
        print(f"{name:10} {StudyDefinition.load(name).description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = {
        "run": _cmd_run,
        "export": _cmd_export,
        "env": _cmd_env,
        "launch": _cmd_launch,
        "dashboard": _cmd_dashboard,
        "report": _cmd_report,
        "spaces": _cmd_spaces,
        "trainers": _cmd_trainers,
        "studies": _cmd_studies,
        "lab": _cmd_lab,
    }[args.command]
    try:
        return command(args)
    except ConfigError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BaselineFailed as e:
        print(f"autotune: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autotune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `autotune spaces | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except AutotuneError as e:
        print(f"autotune: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
