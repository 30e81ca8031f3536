"""Script mode on the Ray cluster: one trial is the user's command started on every node of its
placement group, measured from global rank 0.

The trial's placement group has one bundle per node (``launcher.TrialRunner`` with
``ranks_per_bundle``: the ranks torchrun starts there, their CPUs, and one GPU each with nccl),
``strict_spread`` over distinct nodes, or ``strict_pack`` on one. ``run_on_nodes`` (the
driver's side) starts one Ray task per bundle (``run_node``): the task on the first bundle is
the **leader**, which measures the trial exactly as on one machine (``script.command``: rank 0's
step reports, read on its own node); the others are **followers**, which start the same command
with their node rank (``script.job.node_command``: torchrun's static rendezvous puts global rank
0 on the first node) and wait until the leader's task has ended, watching it through Ray
(``ray.wait`` on its ref), then end their command. Each node's command runs under the guard
(``script.guard``), so its processes end with the task, with the task's worker (a cancel with
force, or the driver's job ending after ``kill -9``), or with the trial.

What ends a trial, and how it is recorded:

* the leader measured it: the followers end their commands and return their ranks' peak memory
  and their logs; the trial's peak is the largest over the nodes;
* the leader failed: its failure, unless a follower's command failed with an error of its own
  (the leader's ranks then only saw a peer go away): the follower's, naming its node;
* a follower's command exited first, or its task died: the leader is cancelled; a node the
  cluster reports dead makes the trial ``node_lost`` (as for built-in trials), else the
  follower's failure;
* no answer by the trial's timeout: ``timeout``; Ctrl-C or SIGTERM (``TrialRunner.abort``):
  every task is cancelled and the trial is ``interrupted``.

**The job's files.** ``check_files`` asks every bundle's node, once per run, whether the
directory where ``autotune run`` was typed holds the same files there (a fingerprint of its
entries and of the script; nothing is written): where they do, as on one machine or a shared
file system, each node runs the command in that directory. Where they do not, the directory
travels with Ray's runtime environment (``working_dir``, at most ``SHIP_LIMIT_BYTES``; past it,
a one-line error before the first trial): the driver joins the cluster again with it, as Ray
takes a local directory for a whole job only, and each node runs the command in its copy.
``AUTOTUNE_SCRIPT_FILES=ship`` ships it always, ``shared`` never.

**The logs.** A node on the driver's machine writes its log under the trial's log directory as
the command runs; another node writes it beside the command and hands it back with its result,
capped as a log is (``core.logfile``). One node: ``script.log``; several: ``node-<I>.log``.

**The environment.** Each node's command starts from the driver's environment (the command as
the user typed it), with the node's own ``CUDA_VISIBLE_DEVICES`` (the GPUs its bundle reserved,
from Ray) and its own network interface variables (``NODE_LOCAL``), then the trial's
configuration, as on one machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core import logfile
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import ConfigError, FailureReason, TrialFailed
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.core.step_report import PROBE_ENV
from autotune.launch.cluster import SHIP_EXCLUDES
from autotune.launch.failures import classify, first_line, gone_away
from autotune.launch.launcher import TASK_GRACE_S, TrialRunner, first_dead
from autotune.script import command as script_trial
from autotune.script import guard as script_guard
from autotune.script.job import node_command

__all__ = ["SHIP_LIMIT_BYTES", "Files", "NodeOutcome", "check_files", "free_port", "run_node"]
__all__ += ["rendezvous", "run_on_nodes"]

#: The most a directory shipped to the nodes by Ray's runtime environment may hold.
SHIP_LIMIT_BYTES = 100 << 20
#: Variables each node keeps from its own environment rather than the driver's.
NODE_LOCAL = (
    "CUDA_VISIBLE_DEVICES",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
)
#: How long the driver gives the leader to answer once a follower has failed (a leader that has
#: measured may be ending its command: the guard's stages).
LEADER_GRACE_S = script_guard.GRACE_S + script_guard.KILL_S + 2
#: The driver's variables no node's command gets: Ray's (its token, its private temp dir) are
#: the driver's connection, not the job's.
DRIVER_ONLY_PREFIXES = ("RAY_",)
#: How often a follower asks whether the leader has ended.
FOLLOW_POLL_S = 0.25
#: How long the driver waits for the other nodes' answers once the leader has one (each ends
#: its command through the guard: its SIGTERM and SIGKILL stages).
FOLLOWERS_WAIT_S = script_guard.GRACE_S + script_guard.KILL_S + 5


@dataclass(frozen=True)
class Files:
    """Where each node finds the job's files: ``shared`` (the directory ``cwd`` holds the same
    files on every node) or shipped with Ray's runtime environment: Ray takes a local directory
    for the whole job only (``ray.init``'s ``working_dir``), so the caller joins the cluster
    again with it (``launch.cluster.connect``), and each task runs in its copy."""

    cwd: str
    shared: bool
    size: int = 0
    """Bytes shipped (0 when shared)."""

    def describe(self, nodes: int) -> str:
        """The run's line saying which applies."""
        if self.shared:
            where = "every node sees" if nodes > 1 else "the node sees"
            return (
                f"Script mode on {nodes} node(s): {where} the same files in {self.cwd}; the "
                "command runs there"
            )
        return (
            f"Script mode on {nodes} node(s): the nodes do not all see the files of {self.cwd}; "
            f"it travels to each with Ray's runtime environment ({self.size / 2**20:.1f} MiB of "
            f"at most {SHIP_LIMIT_BYTES >> 20} MiB)"
        )


#: The most entries below the directory the fingerprint reads (past them: not the same files).
FINGERPRINT_ENTRIES = 20_000


def fingerprint(directory: str, script: str | None) -> str:
    """What identifies the job's files in ``directory``: every entry below it
    (``SHIP_EXCLUDES`` left out) by its path, kind, size and modification time, and the
    script's bytes (``script``, relative to it). Equal on two nodes: the same files, which a
    copy made apart (another time stamp) is not. Empty past ``FINGERPRINT_ENTRIES``."""
    h = hashlib.sha256()
    seen = 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in SHIP_EXCLUDES)
        for name in sorted([*dirs, *files]):
            seen += 1
            if seen > FINGERPRINT_ENTRIES:
                return ""
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                rel = os.path.relpath(path, directory)
                h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    if script:
        with contextlib.suppress(OSError), open(os.path.join(directory, script), "rb") as f:
            h.update(f.read(16 << 20))
    return h.hexdigest()


def _sees(directory: str, script: str | None, expected: str) -> bool:
    """On a node: whether ``directory`` holds the job's files (``fingerprint``), in a directory
    of this user's that no one else can write (another user's directory at the same path,
    holding look-alike files, would run its code as this user)."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return False
    return fingerprint(directory, script) == expected


def directory_size(directory: str, limit: int) -> int:
    """Bytes of the files below ``directory`` that shipping would take (``SHIP_EXCLUDES`` left
    out), counting stops once past ``limit``. A link that leads out of the directory is a
    ``ConfigError``: Ray's packing follows links, so the file it names (``/etc/passwd``,
    ``~/.ssh``) would travel to every node, and past the size limit unseen."""
    top = os.path.realpath(directory)
    total = 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in SHIP_EXCLUDES]
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if os.path.commonpath([top, target]) != top:
                    raise ConfigError(
                        f"{path} is a link out of {directory} (to {target}), which would travel "
                        "to every node; remove it, or run autotune from a directory without it"
                    )
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
            if total > limit:
                return total
    return total


def check_files(runner: TrialRunner, command: Sequence[str], cwd: str) -> Files:
    """Whether every bundle's node sees the job's files in ``cwd`` (module doc), and so how the
    command reaches them. Raises ``ConfigError`` when they must travel and are too large."""
    import ray

    script = next((w for w in command[1:] if w.endswith(".py") and not os.path.isabs(w)), None)
    mode = os.environ.get("AUTOTUNE_SCRIPT_FILES", "auto")
    if mode not in ("auto", "ship", "shared"):
        raise ConfigError(f"AUTOTUNE_SCRIPT_FILES={mode}: give auto, ship or shared")
    shared = mode == "shared"
    if mode == "auto":
        expected = fingerprint(cwd, script)
        tasks = [
            runner.start_task(_sees, i, directory=cwd, script=script, expected=expected)
            for i in range(runner.bundles)
        ]
        try:
            shared = all(ray.get(tasks, timeout=TASK_GRACE_S * 4))
        except ray.exceptions.RayError as e:
            raise ConfigError(
                f"could not ask the trial's nodes whether they see the files of {cwd} "
                f"({first_line(str(e))}); check the cluster, or set AUTOTUNE_SCRIPT_FILES"
            ) from None
        finally:
            for t in tasks:
                runner.task_done(t)
    if shared:
        return Files(cwd=cwd, shared=True)
    size = directory_size(cwd, SHIP_LIMIT_BYTES)
    if size > SHIP_LIMIT_BYTES:
        raise ConfigError(
            f"the directory {cwd} must travel to the trial's nodes (they do not see its files) "
            f"and holds over {SHIP_LIMIT_BYTES >> 20} MiB; run autotune from a directory with "
            f"only the job's code, or put it on a file system every node shares"
        )
    return Files(cwd=cwd, shared=False, size=size)


@dataclass
class NodeOutcome:
    """What one node's task returns: the leader's measurement (``result``) or a failure, the
    node's ranks' peak memory, and its log when the driver cannot read it where it was
    written."""

    node: int
    result: TrialResult | None = None
    failure: TrialFailed | None = None
    peak_mb: float = 0.0
    log: bytes | None = None
    stepped: bool = True
    """Whether any rank on this node reported a step. A follower whose ranks never did cannot
    have its command ended by the leader's end of a measurement (the leader's ranks cannot
    finish a step without them): the driver then ends the leader without waiting for it."""


def free_port() -> tuple[str, int]:
    """On the first node: its address and a port free on it now, for torchrun's rendezvous."""
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind((ip, 0))
        return ip, s.getsockname()[1]


def _node_env(driver_env: Mapping[str, str]) -> dict[str, str]:
    """The command's environment on this node (module doc): the driver's, with this node's
    ``NODE_LOCAL`` variables; the bundle's GPUs, as Ray gave them to this task."""
    import ray

    env = {
        k: v
        for k, v in driver_env.items()
        if k not in NODE_LOCAL and not k.startswith(DRIVER_ONLY_PREFIXES)
    }
    env.update({k: os.environ[k] for k in NODE_LOCAL if k in os.environ})
    gpus = ray.get_gpu_ids()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def run_node(
    *,
    node: int,
    command: Sequence[str],
    leader: list[Any] | None,
    log_dir: str | None,
    log_name: str,
    driver_node: str,
    driver_env: Mapping[str, str],
    cwd: str | None,
    **measure: Any,
) -> NodeOutcome:
    """One node's part of a trial, as a Ray task in its bundle (module doc): the leader
    (``leader`` None) measures with ``script_trial.run_script``'s ``measure`` arguments; a
    follower runs the command until the leader's task (``leader[0]``) has ended."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    direct = log_dir is not None and here == driver_node
    log = Path(log_dir) / log_name if direct and log_dir else None
    env = _node_env(driver_env)
    out = NodeOutcome(node=node)
    config: TrialConfig = measure["config"]
    try:
        launch = script_trial.Launch(
            command,
            config,
            measure["world_size"],
            measure["backend"],
            log,
            cwd or os.getcwd(),
            env,
        )
    except TrialFailed as e:  # its log could not be opened
        out.failure = e
        return out
    with launch as run:
        try:
            if leader is None:
                out.result = script_trial.measure_run(run, **measure)
                out.peak_mb = out.result.peak_memory_mb
            else:
                _follow(run, leader[0], node, measure["timeout_s"])
        except TrialFailed as e:
            out.failure = e
        except KeyboardInterrupt:  # cancelled: the outcome, and the log, still go back
            out.failure = TrialFailed(FailureReason.INTERRUPTED, "stopped by the driver")
        finally:
            run.end()
            if leader is not None:  # the peak, whatever ended the command; the driver judges
                out.stepped = reported(run.reports)
                with contextlib.suppress(TrialFailed):
                    out.peak_mb = script_trial.peak_of_ranks(run.reports, None)
            if log_dir is not None and not direct:
                out.log = logfile.tail(run.log, logfile.LIMIT.max_bytes)
    return out


def reported(reports: Path) -> bool:
    """Whether any rank of this node wrote a line to its step report."""
    return any(p.stat().st_size > 0 for p in reports.glob("rank-*.steps"))


def _follow(run: script_trial.Launch, leader: Any, node: int, timeout_s: float) -> None:
    """Run until the leader's task has ended. A command that exits first waits up to
    ``FOLLOWERS_WAIT_S`` for the leader (whose own end of its command makes this node's ranks
    lose their peers), then fails naming this node and the command's last error line; one whose
    ranks never reported a step fails at once (the leader cannot be ending a measurement
    without them). Stop on our own after the trial's timeout and grace."""
    import ray

    def ended(timeout: float) -> bool:  # without fetching the leader's outcome here
        return bool(ray.wait([leader], timeout=timeout, fetch_local=False)[0])

    until = time.monotonic() + timeout_s + TASK_GRACE_S
    while time.monotonic() < until:
        if ended(FOLLOW_POLL_S):
            return
        code = run.exited()
        if code is not None:
            wait = FOLLOWERS_WAIT_S if reported(run.reports) else 0.0
            if ended(wait):  # the leader ended meanwhile: it decides
                return
            said = script_trial.error_line(run.log)
            raise TrialFailed(
                FailureReason.CRASH,
                f"node {node}: the command exited with status {code}"
                + (f": {said}" if said else ""),
            )


@dataclass
class _Trial:
    """The driver's view of one running trial's tasks."""

    runner: TrialRunner
    refs: dict[Any, int]
    nodes: dict[int, str]
    outcomes: dict[int, NodeOutcome] = field(default_factory=dict)
    failures: dict[int, TrialFailed] = field(default_factory=dict)


def run_on_nodes(
    runner: TrialRunner,
    *,
    command: Sequence[str],
    files: Files,
    config: TrialConfig,
    measure: MeasureSettings,
    timeout_s: float,
    incumbent: Interval | None = None,
    log_dir: str | None = None,
    max_memory_mb: float | None = None,
    env: Mapping[str, str] | None = None,
    probe: bool = False,
) -> TrialResult:
    """One trial of ``command`` on every bundle's node of ``runner`` (module doc), starting
    from ``env`` (this process's environment by default); ``probe``: with the step's phases
    timed (``script.first_measurement``). Raises ``TrialFailed``."""
    import ray

    runner.ensure_placed()
    started = time.monotonic()
    nodes = runner.bundles
    addr, port = "", 0
    if nodes > 1:
        addr, port = rendezvous(runner)
    common: dict[str, Any] = dict(
        log_dir=log_dir,
        driver_node=ray.get_runtime_context().get_node_id(),
        driver_env={**(os.environ if env is None else env), **({PROBE_ENV: "1"} if probe else {})},
        cwd=files.cwd if files.shared else None,
        config=config,
        world_size=runner.world_size,
        backend=runner.backend,
        measure=measure,
        timeout_s=timeout_s,
        incumbent=incumbent,
        max_memory_mb=max_memory_mb,
    )

    def start(i: int, leader: Any) -> Any:
        cmd = node_command(command, nodes=nodes, node_rank=i, addr=addr, port=port)
        name = "script.log" if nodes == 1 else f"node-{i}.log"
        return runner.start_task(
            run_node,
            i,
            node=i,
            command=cmd,
            leader=leader,
            log_name=name,
            **common,
        )

    t = _Trial(runner, {}, runner.bundle_nodes())
    try:  # from the first task on: whatever happens, every task started is ended
        first = start(0, None)
        t.refs[first] = 0
        for i in range(1, nodes):
            t.refs[start(i, [first])] = i
        _wait(t, first, started + timeout_s + TASK_GRACE_S, timeout_s)
    finally:
        _finish(t)
        if log_dir is not None:
            _save_logs(t, Path(log_dir), nodes)
    return _result(t, time.monotonic() - started, max_memory_mb)


def rendezvous(runner: TrialRunner) -> tuple[str, int]:
    """The first node's address and a free port there (``free_port``, as a task in the first
    bundle); a task that fails or does not answer fails the trial."""
    import ray

    task = runner.start_task(free_port, 0)
    try:
        return ray.get(task, timeout=TASK_GRACE_S)
    except ray.exceptions.RayError as e:
        f = classify(0, e)
        raise TrialFailed(f.reason, "the rendezvous on node 0: " + first_line(f.detail)) from None
    finally:
        runner.end_tasks([task], grace_s=0)


def _wait(t: _Trial, first: Any, deadline: float, timeout_s: float) -> None:
    """Wait for the leader's answer, or a follower's failure first (module doc)."""
    import ray

    pending = list(t.refs)
    while first in pending:
        left = deadline - time.monotonic()
        done, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0))
        if not done:
            raise TrialFailed(FailureReason.TIMEOUT, f"no answer after {timeout_s:.0f}s")
        _take(t, done[0])
        i = t.refs[done[0]]
        if i != 0 and i in t.failures:  # a follower's command ended first: the trial is over
            # unless the leader was just ending its measured command, which it cannot be where
            # the follower's ranks never stepped (a short grace still: a leader failing at the
            # same moment answers by itself, and a cancel never crosses its reply)
            out = t.outcomes.get(i)
            grace = LEADER_GRACE_S if out is None or out.stepped else script_guard.GRACE_S
            if not t.runner.end_tasks([first], grace_s=grace, force=False):
                _take(t, first)
            break


def _take(t: _Trial, ref: Any) -> None:
    """Read one node's answer into ``t``: its outcome, or the failure its task died of."""
    import ray
    import ray.exceptions as rex

    i = t.refs[ref]
    t.runner.task_done(ref)
    try:
        out: NodeOutcome = ray.get(ref)
    except rex.TaskCancelledError:
        t.failures[i] = TrialFailed(FailureReason.INTERRUPTED, "stopped by the driver")
        return
    except rex.NodeDiedError as e:
        why = first_line(str(e))
        if i in t.nodes:  # not to be placed on again, though the cluster may not say so yet
            t.runner.lost_nodes.add(t.nodes[i])
        t.failures[i] = TrialFailed(FailureReason.NODE_LOST, f"node {i}: its node was lost ({why})")
        return
    except rex.RayError as e:  # the task raised, or its worker died (or its node, said otherwise)
        if isinstance(e, rex.RayTaskError) and isinstance(e.cause, TrialFailed):
            t.failures[i] = e.cause
        else:
            f = classify(0, e)
            detail = f"node {i}: " + f.detail.removeprefix("rank 0: ")
            t.failures[i] = TrialFailed(f.reason, detail)
        return
    t.outcomes[i] = out
    if out.failure is not None:
        t.failures[i] = out.failure


def _finish(t: _Trial) -> None:
    """Collect the answers still out (each task ends its command once the leader has ended, or
    on a cancel); a task with no answer in time is cancelled, then killed with its worker."""
    import ray

    pending = [r for r in t.refs if t.refs[r] not in t.outcomes and t.refs[r] not in t.failures]
    for force in (False, True):
        if not pending:
            return
        if force or (0 not in t.outcomes and 0 not in t.failures):  # the leader has no answer
            for ref in pending:  # only the tasks still running (``TrialRunner.end_tasks``)
                if not ray.wait([ref], timeout=0, fetch_local=False)[0]:
                    ray.cancel(ref, force=force)
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=FOLLOWERS_WAIT_S)
        for ref in done:
            _take(t, ref)
    for ref in pending:
        t.runner.task_done(ref)


def _save_logs(t: _Trial, log_dir: Path, nodes: int) -> None:
    """The logs the nodes handed back, under the trial's log directory."""
    for i, out in sorted(t.outcomes.items()):
        if out.log is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            name = "script.log" if nodes == 1 else f"node-{i}.log"
            fd = os.open(
                log_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(fd, "wb") as f:
                f.write(out.log)


def _node_lost(t: _Trial) -> TrialFailed | None:
    """``node_lost`` when the cluster reports a node of the trial dead (it may take a few
    seconds to declare it), else None."""
    lost = first_dead(t.nodes)
    if lost is None:
        return None
    return TrialFailed(
        FailureReason.NODE_LOST,
        f"node {lost}: its node was lost (the cluster reports node {t.nodes[lost][:12]} dead)",
    )


def _cause(t: _Trial) -> TrialFailed:
    """The failure to record (module doc): a lost node first; a follower's own error over
    the leader's when the leader's ranks only lost a peer; else the leader's."""
    fs = t.failures
    if not fs:  # the leader's task gave no answer, even killed: nothing else to go by
        why = "interrupted" if t.runner.aborted else "crash"
        return TrialFailed(FailureReason(why), "node 0: its task gave no answer")
    if any(f.reason == FailureReason.NODE_LOST for f in fs.values()):
        return next(f for f in fs.values() if f.reason == FailureReason.NODE_LOST)
    if t.runner.aborted:
        return fs.get(0) or next(iter(fs.values()))
    followers = [f for i, f in sorted(fs.items()) if i != 0]
    died = [f for f in followers if gone_away(f) or "died" in f.detail.lower()]
    if died or (followers and 0 in fs and gone_away(fs[0])):
        lost = _node_lost(t)
        if lost is not None:
            return lost
    own = [f for f in followers if f.reason != FailureReason.INTERRUPTED and not gone_away(f)]
    if 0 not in fs or fs[0].reason == FailureReason.INTERRUPTED:
        return (own or followers)[0]
    if own and fs[0].reason == FailureReason.CRASH:
        return own[0]
    return fs[0]


def _result(t: _Trial, wall_s: float, max_memory_mb: float | None) -> TrialResult:
    """The leader's measurement with every node's peak memory, or the trial's failure."""
    if 0 in t.failures or 0 not in t.outcomes:
        raise _cause(t)
    result = t.outcomes[0].result
    assert result is not None
    peak = max(out.peak_mb for out in t.outcomes.values())
    for i, out in sorted(t.outcomes.items()):
        if max_memory_mb is not None and out.peak_mb > max_memory_mb:
            raise TrialFailed(
                FailureReason.OOM,
                f"node {i}: peak memory {out.peak_mb:.0f} MiB is over --max-memory "
                f"{max_memory_mb:.0f} MiB",
            )
    rank0 = result.ranks[0]
    rank0.peak_memory_mb = peak
    return TrialResult(ranks=[rank0], wall_s=wall_s)
