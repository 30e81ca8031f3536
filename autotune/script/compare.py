"""``autotune compare A B -- CMD``: two profiles measured side by side in the user's own command,
their check that a profile still pays on their job (docs/script-mode.md, *autotune compare*).

``A`` and ``B`` are each a profile file or ``asis`` (``AS_IS``), the job as it is. A run is one
run of ``CMD`` measured and ended as a script-mode trial (``script.command.run_script``: warm-up,
windows, stop rule, failures, containment), with the arm's configuration: a profile gives its
environment and its settings (``AUTOTUNE_PROFILE``) as ``autotune launch`` does; ``asis`` gives
nothing of autotune's to the environment (no allocator pin, ``OMP_NUM_THREADS``, ``NCCL_*``)
and a script that loads its profile PyTorch's defaults at the same global batch. Runs are
interleaved (``core.choice.interleave``), paired by round: B/A is ``core.stats.speedup_ci`` of
the runs' median windows. ``asis`` with a file of that name here is refused (``./asis`` names
the file). Bad input is a ``ConfigError`` before anything runs; the tuner's packages are
imported only once the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.core.errors import ConfigError
from autotune.core.values import ratio_interval

__all__ = ["AS_IS", "Arm", "Plan", "Run", "add_compare_parser", "cmd_compare", "ratio", "verdict"]

#: The word for the job as it is (no profile), in place of a profile's path.
AS_IS = "asis"
DEFAULT_ROUNDS = 4
MAX_ROUNDS = 100
KEYS = ("A", "B")
USAGE = "autotune compare [options] A B -- COMMAND [ARGS...]"


def add_compare_parser(sub: Any) -> None:
    """``autotune compare`` on the ``autotune`` parser's subcommands ``sub``."""
    c = sub.add_parser(
        "compare",
        help="measure two profiles (or asis: the job as it is) interleaved in your own command",
        usage=USAGE,
        description="Run COMMAND (as for autotune run ... -- COMMAND) with profile A and with "
        "profile B in interleaved rounds, each run measured as a script-mode trial, and print "
        f"B/A with its 95 % interval. {AS_IS} in place of a profile is the job as it is: "
        "nothing of autotune's in the environment, PyTorch's defaults in the script's profile.",
    )
    for names, kw in _options():
        c.add_argument(*names, **kw)
    c.set_defaults(action=cmd_compare, compare_parser=c)


def _options() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """(names, add_argument's keywords) of each of compare's arguments."""
    batch = f"samples per optimizer step over all ranks (the profile's; needed for {AS_IS} {AS_IS})"
    return [
        (
            ("--rounds",),
            {
                "type": _rounds,
                "metavar": "N",
                "default": DEFAULT_ROUNDS,
                "help": f"rounds, each one run of A and one of B ({DEFAULT_ROUNDS})",
            },
        ),
        (("--global-batch",), {"type": int, "metavar": "N", "help": batch}),
        (
            ("--study",),
            {
                "default": "default",
                "metavar": "NAME|FILE",
                "help": "the study definition whose measure: settings time each run",
            },
        ),
        (
            ("--timeout",),
            {
                "default": "10m",
                "metavar": "DURATION",
                "help": "end a run not measured after this (10m)",
            },
        ),
        (("--log-dir",), {"type": Path, "metavar": "DIR", "help": "keep each run's output here"}),
        (
            ("--address",),
            {
                "metavar": "HOST:PORT|auto",
                "help": "the Ray cluster whose nodes a torchrun over several nodes "
                "(--nnodes N) runs on, as for autotune run",
            },
        ),
        (
            ("-o", "--output"),
            {"type": Path, "metavar": "FILE", "help": "write the result here (.yaml or .json)"},
        ),
        (
            ("words",),
            {
                "nargs": argparse.REMAINDER,
                "metavar": "A B -- COMMAND",
                "help": f"A and B: each a profile file or {AS_IS}",
            },
        ),
    ]


def _rounds(text: str) -> int:
    if not text.isdigit() or not 2 <= int(text) <= MAX_ROUNDS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of rounds from 2 (an interval needs 2 pairs) to {MAX_ROUNDS}"
        )
    return int(text)


@dataclass(frozen=True)
class Arm:
    """One side: ``key`` A or B, ``name`` as typed, the configuration its runs get, and the
    profile (None for ``asis``)."""

    key: str
    name: str
    config: Any  # core.config.TrialConfig
    profile: Any = None  # profile.profile.Profile | None


@dataclass(frozen=True)
class Plan:
    """What the runs are, checked before the first (``make_plan``)."""

    arms: tuple[Arm, Arm]
    command: tuple[str, ...]
    world_size: int
    global_batch: int
    backend: str
    rounds: int
    measure: Any  # core.config.MeasureSettings
    timeout_s: float
    log_dir: Path | None = None
    output: Path | None = None
    nodes: int = 1
    address: str | None = None
    """The Ray cluster the runs go to (``--address``); None: children of this process."""


@dataclass
class Run:
    """One measured run (``samples_per_s`` the median window) or one that failed."""

    round: int
    key: str
    samples_per_s: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)
    windows: list[float] = field(default_factory=list)
    stop: str = ""
    wall_s: float = 0.0
    failure: str = ""


def split_words(words: Sequence[str]) -> tuple[str, str, list[str], list[str]]:
    """``A B [options] -- CMD ...`` -> A, B, the options between B and ``--``, the command."""
    i = list(words).index("--") if "--" in words else len(words)
    head, cmd = list(words[:i]), list(words[i + 1 :])
    if len(head) < 2 or any(w.startswith("-") and w != "-" for w in head[:2]):
        raise _error(f"give two profiles (or {AS_IS}) before --: {USAGE}")
    if not cmd:
        raise _error(f"no command after --; write {USAGE}")
    return head[0], head[1], head[2:], cmd


def _error(text: str) -> ConfigError:
    return ConfigError(f"autotune compare: {text}")


def load_arm(key: str, text: str, cwd: Path) -> Any:
    """The profile ``text`` names, or None for ``asis``; a ``ConfigError`` naming it and the
    fix otherwise."""
    from autotune.profile.profile import Profile

    if text == AS_IS:
        if (cwd / AS_IS).exists():
            raise _error(
                f"{key} {AS_IS!r} is the word for the job as it is, and a file {AS_IS} "
                f"is here too; write ./{AS_IS} for the file"
            )
        return None
    path = cwd / text
    if not path.exists():
        raise _error(
            f"{key} {text}: no such file; give a profile (autotune run writes one) "
            f"or {AS_IS} for the job as it is"
        )
    try:
        return Profile.load(path)
    except ConfigError as e:
        raise _error(f"{key}: {e}") from None


def as_is_config(global_batch: int, world_size: int, backend: str) -> Any:
    """PyTorch's defaults at ``global_batch`` (no accumulation), with no environment: what
    ``asis`` runs give a script that loads its profile."""
    from autotune.core.config import TrialConfig
    from autotune.core.target import Target

    target = Target(
        backend=backend,
        device="cuda" if backend == "nccl" else "cpu",
        world_size=world_size,
        global_batch=global_batch,
        cpus_per_rank=max(1, (os.cpu_count() or 1) // world_size),
        ranks_per_node=world_size,
    )
    return replace(TrialConfig.defaults(target), env={})


def _global_batch(given: int | None, profiles: dict[str, Any]) -> int:
    """The global batch both arms run: ``--global-batch``, else the profiles' (which agree)."""
    batches = {f"{k} {p.batch['global_batch']}" for k, p in profiles.items()}
    values = {p.batch["global_batch"] for p in profiles.values()}
    if given is not None:
        if given < 1 or values - {given}:
            raise _error(
                f"--global-batch {given}: give the batch the profiles were measured at "
                f"({', '.join(sorted(batches))}), or leave it out"
            )
        return given
    if not values:
        raise _error(
            f"give --global-batch N when A and B are both {AS_IS} (the samples per "
            "optimizer step over all ranks of your script)"
        )
    if len(values) > 1:
        raise _error(
            f"the profiles were measured at different global batches "
            f"({', '.join(sorted(batches))}): they are not the same job"
        )
    return values.pop()


def _job(command: list[str], global_batch: int) -> Any:
    """The command's ``script.job.ScriptJob`` (world size, nodes), checked as script mode
    checks its command."""
    from autotune.definition.studydef import StudyDefinition
    from autotune.script.job import script_job

    d = StudyDefinition.load("default")
    try:
        d = replace(d, command=tuple(command), global_batch=global_batch, world_size=None)
        _, job = script_job(d)
    except ConfigError as e:
        raise _error(str(e).removeprefix("autotune run -- CMD: ")) from None
    return job


def make_plan(args: argparse.Namespace, cwd: Path) -> Plan:
    """Check everything (``ConfigError`` naming the thing and the fix); nothing is started."""
    from autotune.definition.durations import parse_duration
    from autotune.definition.paths import check_command, check_writable
    from autotune.definition.studydef import StudyDefinition

    a, b, between, command = split_words(args.words)
    if between:  # options typed after B: read them as the parser does
        args.compare_parser.parse_args(between, namespace=args)
        if args.words:
            raise _error(f"unexpected {args.words[0]!r} before --: {USAGE}")
    profiles = {k: load_arm(k, t, cwd) for k, t in zip(KEYS, (a, b), strict=True)}
    check_command(command[0], who="autotune compare")
    given = {k: p for k, p in profiles.items() if p is not None}
    batch = _global_batch(args.global_batch, given)
    job = _job(command, batch)
    world = job.world_size
    if job.nodes > 1 and args.address is None:
        raise _error(
            f"the command spans {job.nodes} nodes (--nnodes): give --address, the Ray cluster "
            "whose nodes it runs on (HOST:PORT of its head, or auto)"
        )
    for k, p in given.items():
        ranks = p.workload.get("world_size")
        if ranks not in (None, world):
            raise _error(
                f"{k} was measured with {ranks} ranks and the command starts {world}: "
                "compare it where it was measured, or tune again"
            )
    backend = next((p.workload.get("backend", "gloo") for p in given.values()), "gloo")
    arm_a, arm_b = (
        Arm(k, t, as_is_config(batch, world, backend) if p is None else p.trial_config(), p)
        for k, t, p in zip(KEYS, (a, b), profiles.values(), strict=True)
    )
    if args.output is not None:
        if args.output.suffix not in (".yaml", ".yml", ".json"):
            raise _error(f"-o {args.output}: give a file name ending .yaml or .json")
        check_writable(args.output, flag="-o", directory=False)
    if args.log_dir is not None:
        check_writable(args.log_dir, flag="--log-dir", directory=True)
    measure = StudyDefinition.load(args.study).measure
    timeout = parse_duration(args.timeout, what="--timeout")
    return Plan(
        (arm_a, arm_b),
        tuple(command),
        world,
        batch,
        backend,
        args.rounds,
        measure,
        timeout,
        args.log_dir,
        args.output,
        nodes=job.nodes,
        address=args.address,
    )


def measure(plan: Plan, say: Callable[[str], None]) -> list[Run]:
    """Run the plan's rounds in ``core.choice.interleave``'s order, one line each through
    ``say``; stops at the first run that fails (its ``Run`` has the ``failure``)."""
    if plan.address is not None:
        with _on_cluster(plan, say) as run_once:
            return _rounds_of(plan, say, run_once)
    return _rounds_of(plan, say, _here(plan))


def _here(plan: Plan) -> Callable[..., Any]:
    """One run on this machine, a child of this process (``script.command.run_script``)."""
    from autotune.script.command import run_script

    def run_once(config: Any, log_dir: Path | None, env: dict[str, str] | None) -> Any:
        return run_script(
            plan.command,
            config,
            world_size=plan.world_size,
            measure=plan.measure,
            backend=plan.backend,
            timeout_s=plan.timeout_s,
            log_dir=log_dir,
            env=env,
        )

    return run_once


@contextlib.contextmanager
def _on_cluster(plan: Plan, say: Callable[[str], None]) -> Any:
    """One run on the Ray cluster at ``plan.address`` as a script-mode trial runs
    (``script.nodes.run_on_nodes``: one bundle per node, the same placement and containment);
    the cluster joined and the placement group made once for every run."""
    from autotune.launch.cluster import connect, plan_ranks
    from autotune.launch.launcher import TrialRunner
    from autotune.script.nodes import check_files, run_on_nodes

    placement = "strict_spread" if plan.nodes > 1 else "strict_pack"

    def place() -> TrialRunner:
        ranks = plan_ranks(plan.world_size, plan.backend, placement)
        return TrialRunner(
            world_size=plan.world_size,
            backend=plan.backend,
            strategy=placement,
            cpus_per_rank=ranks.cpus_per_rank,
            ranks_per_bundle=plan.world_size // plan.nodes,
        )

    conn = connect(plan.address)
    runner = None
    try:
        runner = place()
        files = check_files(runner, plan.command, os.getcwd())
        if not files.shared:  # Ray ships a directory for a whole job: join again with it
            runner.close()
            runner = None
            conn.close()
            conn = connect(plan.address, working_dir=files.cwd)
            runner = place()
        say(files.describe(plan.nodes))

        def run_once(config: Any, log_dir: Path | None, env: dict[str, str] | None) -> Any:
            return run_on_nodes(
                runner,
                command=plan.command,
                files=files,
                config=config,
                measure=plan.measure,
                timeout_s=plan.timeout_s,
                log_dir=None if log_dir is None else str(log_dir),
                env=env,
            )

        yield run_once
    finally:
        if runner is not None:
            runner.close()
        conn.close()


def _rounds_of(plan: Plan, say: Callable[[str], None], run_once: Callable[..., Any]) -> list[Run]:
    """``measure``'s rounds, each run by ``run_once(config, log_dir, env)``."""
    from autotune.core import allocator
    from autotune.core.choice import interleave
    from autotune.core.errors import TrialFailed

    arms = {a.key: a for a in plan.arms}
    order = interleave(KEYS, plan.rounds)
    runs: list[Run] = []
    seen = dict.fromkeys(KEYS, 0)
    for n, key in enumerate(order, 1):
        seen[key] += 1
        arm, run = arms[key], Run(round=seen[key], key=key)
        log_dir = None if plan.log_dir is None else plan.log_dir / f"run-{n}-{key}"
        env = allocator.without_pin(os.environ) if arm.profile is None else None
        try:
            result = run_once(arm.config, log_dir, env)
        except TrialFailed as e:
            run.failure = str(e)
        else:
            ci = result.interval
            run.samples_per_s, run.interval = ci.median, (ci.low, ci.high)
            run.windows, run.stop = list(result.windows), result.ranks[0].stop
            run.wall_s = result.wall_s
        runs.append(run)
        say(run_line(n, len(order), run, arm, max(len(a.name) for a in plan.arms)))
        if run.failure:
            break
    return runs


def run_line(n: int, total: int, run: Run, arm: Arm, width: int = 0) -> str:
    """One run, in one line (the side's name padded to ``width``)."""
    head = f"run {n}/{total}  round {run.round}  {arm.key} {arm.name:{width}}"
    if run.failure:
        return f"{head}  failed: {run.failure}"
    low, high = run.interval
    return (
        f"{head}  {run.samples_per_s:.1f} samples/s [{low:.1f}, {high:.1f}]  "
        f"{len(run.windows)} windows ({run.stop})  {run.wall_s:.1f} s"
    )


def ratio(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Any:
    """B/A from paired rounds (``a[i]`` and ``b[i]`` ran in the same round): the geometric
    mean of the rounds' ratios with its interval (``core.stats.speedup_ci``)."""
    from autotune.core.stats import speedup_ci

    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"ratio: need two or more paired rounds, got {len(a)} and {len(b)}")
    return speedup_ci(b, a, confidence)


def verdict(r: Any) -> str:
    """One line from B/A's interval ``r``: B faster or slower beyond the noise, or neither."""
    said = ratio_interval(r.median, r.low, r.high)
    if r.low > 1:
        return f"B is faster: B/A {said}"
    if r.high < 1:
        return f"B is slower: B/A {said}"
    return f"no difference beyond the noise: B/A {said}"


def summary(plan: Plan, runs: list[Run]) -> dict[str, Any]:
    """The result as a JSON-safe mapping (``-o``), ``ratio`` and ``verdict`` when every round
    was measured."""
    done = [r for r in runs if not r.failure]
    per = {k: [r.samples_per_s for r in done if r.key == k] for k in KEYS}
    out: dict[str, Any] = {
        "command": list(plan.command),
        "world_size": plan.world_size,
        "global_batch": plan.global_batch,
        "rounds": plan.rounds,
        "arms": {
            a.key: {"name": a.name, "as_is": a.profile is None, "samples_per_s": per[a.key]}
            for a in plan.arms
        },
        "runs": [
            {
                "round": r.round,
                "arm": r.key,
                "samples_per_s": _finite(r.samples_per_s),
                "interval": [_finite(x) for x in r.interval],
                "windows": r.windows,
                "stop": r.stop,
                "wall_s": round(r.wall_s, 2),
                "failure": r.failure or None,
            }
            for r in runs
        ],
    }
    if len(done) == 2 * plan.rounds:
        r = ratio(per["A"], per["B"])
        out["ratio"] = {"b_over_a": r.to_dict(), "confidence": 0.95}
        out["verdict"] = verdict(r)
    return out


def _finite(x: float) -> float | None:  # JSON has no infinity
    return x if math.isfinite(x) else None


def write(path: Path, result: dict[str, Any]) -> None:
    """``result`` as JSON (``.json``) or YAML, written whole."""
    from autotune.core import safe_yaml
    from autotune.core.files import replace_whole

    text = json.dumps(result, indent=2) + "\n" if path.suffix == ".json" else safe_yaml.dump(result)
    path = path.expanduser().absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, lambda f: f.write(text.encode()), ordinary_mode=True)


def _final_lines(plan: Plan, result: dict[str, Any]) -> list[str]:
    lines = []
    for arm in plan.arms:
        xs = sorted(result["arms"][arm.key]["samples_per_s"])
        what = " (the job as it is)" if arm.profile is None else ""
        lines.append(
            f"{arm.key}  {arm.name}{what}: median {statistics.median(xs):.1f} samples/s, "
            f"runs {xs[0]:.1f}-{xs[-1]:.1f}"
        )
    r = result["ratio"]["b_over_a"]
    lines.append(
        f"B/A  {ratio_interval(r['median'], r['low'], r['high'], digits=3)} (95 % interval, "
        f"{r['n']} paired rounds)"
    )
    lines.append(result["verdict"])
    return lines


def _say(text: str, **kwargs: Any) -> None:
    """A line for the terminal, with the command's own text in it escaped (``terminal_safe``)."""
    from autotune.core.values import terminal_safe

    print(terminal_safe(text), **kwargs)


def cmd_compare(args: argparse.Namespace) -> int:
    """``autotune compare``: check, measure, say. 0 when every run was measured, 1 when one
    failed; Ctrl-C and SIGTERM end the running command (``run_script``'s guard) and reach
    ``autotune.cli.main`` as ``KeyboardInterrupt`` (exit 130, 143)."""
    from autotune.core.errors import Terminated, raise_terminated
    from autotune.core.values import terminal_safe

    plan = make_plan(args, Path.cwd())
    say = functools.partial(_say, flush=True)

    for arm in plan.arms:
        for diff in [] if arm.profile is None else arm.profile.hardware_differences():
            print(
                f"autotune: warning: {arm.key} measured on other hardware: {diff}", file=sys.stderr
            )
    names = ", ".join(f"{a.key} = {a.name}" for a in plan.arms)
    say(f"compare {names}: {plan.rounds} rounds of {' '.join(plan.command)}")
    Terminated.received = False
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        runs = measure(plan, say)
    finally:
        signal.signal(signal.SIGTERM, previous)
    result = summary(plan, runs)
    if plan.output is not None:
        write(plan.output, result)
    failed = next((r for r in runs if r.failure), None)
    if failed is not None:
        print(
            terminal_safe(
                f"autotune: compare: {failed.key} failed in round {failed.round}: {failed.failure}"
            ),
            file=sys.stderr,
        )
        return 1
    for line in _final_lines(plan, result):
        say(line)
    return 0
