"""Script mode, driver side: one trial is one run of the user's own command.

``autotune run ... -- torchrun --nproc-per-node 2 train.py`` (issue 17; see docs/script-mode.md
for what is built and what is not yet). The command is the user's, unchanged; the trial's
configuration reaches it through the environment:

* ``AUTOTUNE_PROFILE`` - a profile file of the trial's configuration. A script that follows
  the README's pattern loads it with ``autotune.Profile.load()`` (no path: this variable), so
  the same script runs as a trial and, under ``autotune launch best.yaml``, as the real job;
* ``AUTOTUNE_REPORT_DIR`` - where ``Profile.wrap`` (``autotune.core.step_report``) has each rank
  append one line per forward pass of the wrapped model: the step's time stamp, and the loss
  when the script calls ``profile.report_loss(loss)``;
* the profile's own environment (``NCCL_*``, ``OMP_NUM_THREADS``, glibc's allocator pin),
  set before the command starts, as ``autotune launch`` does.

The losses rank 0 reports become the trial's loss curve for the numerics guard
(``loss_curve``): one value per optimizer step, the mean of that step's micro-step losses, so
that trials with other accumulation at the same global batch compare like with like.

The command runs under ``autotune.script.guard``, which ends every process the command
started when the trial ends, and by itself should the driver die (``kill -9``).

``StepStream`` turns rank 0's time stamps into the same measurement as a built-in trial's
(``autotune.rank.measure``): ``min_warmup_steps`` steps of warm-up, then windows of about
``window_s``, the first of them warm-up too while they run slower than the ones after them
(``SettleRule.kept_from``), until the stop rule or the prune rule ends it. ``run_script`` starts the
command in a session of its own, reads the reports as they come, and ends it through the
guard once the trial is measured, fails, or runs out of time: no process of the script
outlives its trial. A script that never reports a step within
``wrap_wait_s`` fails with a message naming the fix; one that exits first fails with its exit
status and the last line it printed (read from the end of its log, ``core.logfile``).

The reports are the script's output, not autotune's: each line is checked as it is read
(``core.step_report.Reports``), and a bad one - time stamps equal, backwards or not finite, a
line that is not a report - fails the trial (``crash``) in one line naming the file, the line
and what was wrong. A non-finite loss fails it as ``nan``, as for a built-in trial. The
command's output goes through a pipe to ``script.log``, whose one writer, ``core.logfile.Pump``,
caps it by the log rule without losing a line to a cut: the last line, which names a failure,
is in the log before it is read.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from autotune.core import logfile
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.numerics import CURVE_STEPS
from autotune.core.rank_io import RankResult
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.core.step_report import BadReport, Reports
from autotune.script import guard as script_guard

__all__ = ["PROFILE_ENV", "REPORT_ENV", "Launch", "Reports", "StepStream", "loss_curve"]
__all__ += ["measure_run", "peak_of_ranks", "run_script"]

PROFILE_ENV = "AUTOTUNE_PROFILE"
#: How the guard starts: its path without the directory it runs in (``python -m`` and ``-c``
#: put that first, where a planted ``ctypes.py`` would be imported by the guard itself).
GUARD_BOOT = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "from autotune.script.guard import main; sys.exit(main(sys.argv[1:]))"
)
REPORT_ENV = "AUTOTUNE_REPORT_DIR"
#: How long a script may run before its first reported step (imports, data, process group).
WRAP_WAIT_S = 120.0
POLL_S = 0.05
#: How long the log's pump may take, once the command has exited or been ended, to copy the
#: last of its output (a process it left holding the pipe would keep it open for ever).
DRAIN_S = 5.0


@dataclass
class StepStream:
    """Rank 0's step time stamps in, a measurement out (see the module doc). ``feed`` takes
    the stamps seen so far (seconds, increasing as ``Reports`` checks them) and returns True
    once the trial is measured: ``windows`` (samples/s over all ranks) and ``seconds`` of the
    windows it counts, and ``stop``, hold the result; ``warmup_steps`` the steps before them
    (the discarded ones and the windows that were still warming up)."""

    measure: MeasureSettings
    samples_per_step: float
    incumbent: Interval | None = None
    windows: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    stop: str = ""
    warmup_steps: int | None = None
    steps_per_window: int = 0
    counted_steps: int = 0
    """Steps in the windows counted."""
    timed: list[float] = field(default_factory=list)
    """Every window's samples/s, the warm-up ones included; ``timed_s`` their seconds,
    ``sizes`` their steps (sized from the window before until one is kept)."""
    timed_s: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def feed(self, stamps: Sequence[float]) -> bool:
        if self.stop:
            return True
        m = self.measure
        first = m.discarded_steps  # the last one sizes the first window
        if len(stamps) <= first:
            return False
        if not self.steps_per_window:
            self.steps_per_window = m.window_steps(stamps[first] - stamps[first - 1])
        while True:
            n, k = self.steps_per_window, first + sum(self.sizes)
            if k + n >= len(stamps):
                return False
            seconds = stamps[k + n] - stamps[k]
            if not 0 < seconds < math.inf:  # what Reports refuses: never a division by 0
                raise ValueError(f"steps {k} to {k + n} took {seconds} s: stamps must increase")
            self.sizes.append(n)
            self.timed_s.append(seconds)
            self.timed.append(n * self.samples_per_step / seconds)
            kept, stop = m.judge(self.timed, self.sizes, self.incumbent)
            if stop:
                return self._end(kept or 0, stop)
            if kept is None:  # still warming up: the next window sized from this one if far off
                self.steps_per_window = m.resized(n, seconds)

    def _end(self, kept: int, stop: str) -> bool:
        """The measurement ends: the windows from ``kept`` on count, stop ``stop``."""
        self.warmup_steps = self.measure.discarded_steps + sum(self.sizes[:kept])
        self.windows, self.seconds = self.timed[kept:], self.timed_s[kept:]
        self.counted_steps = sum(self.sizes[kept:])
        self.stop = stop
        return True


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End the command: SIGTERM to its guard, which ends every process the command started
    (``autotune.script.guard``); SIGKILL to the guard's group if it has not exited in time.
    ``send_signal`` signals only a guard not yet reaped (``_watch``'s ``poll`` may have reaped
    it, and its pid may be another process's by now); the group's id is the guard's pid, not
    reaped either when the wait times out."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(script_guard.GRACE_S + script_guard.KILL_S + 2)  # its SIGTERM, SIGKILL stages
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_script(
    command: Sequence[str],
    config: TrialConfig,
    *,
    world_size: int,
    measure: MeasureSettings,
    backend: str = "gloo",
    timeout_s: float,
    incumbent: Interval | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    wrap_wait_s: float = WRAP_WAIT_S,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    max_memory_mb: float | None = None,
) -> TrialResult:
    """Run ``command`` once with ``config`` on this machine and measure it (see the module
    doc); raises ``TrialFailed``. The command's output goes to ``log_dir/script.log`` (a
    temporary file otherwise). ``env``: the environment the command starts from (this
    process's by default). ``max_memory_mb``: a rank whose reported peak memory goes over it
    fails the trial (``oom``), as ``--max-memory`` does for a built-in one."""
    log = None if log_dir is None else Path(log_dir) / "script.log"
    with Launch(command, config, world_size, backend, log, cwd, env) as run:
        return measure_run(
            run,
            config=config,
            world_size=world_size,
            measure=measure,
            timeout_s=timeout_s,
            incumbent=incumbent,
            wrap_wait_s=wrap_wait_s,
            max_memory_mb=max_memory_mb,
        )


def measure_run(
    run: Launch,
    *,
    config: TrialConfig,
    world_size: int,
    measure: MeasureSettings,
    timeout_s: float,
    incumbent: Interval | None = None,
    wrap_wait_s: float = WRAP_WAIT_S,
    max_memory_mb: float | None = None,
    backend: str = "gloo",
) -> TrialResult:
    """Measure the command ``run`` started from its rank 0's reports, then end it (the module
    doc); raises ``TrialFailed``. ``backend`` is the profile's (``Launch`` used it)."""
    stream = StepStream(measure, config.micro_batch * world_size, incumbent)
    try:
        rank0 = _watch(run, stream, timeout_s, wrap_wait_s, max_memory_mb)
    finally:
        run.end()
    peak_mb = peak_of_ranks(run.reports, max_memory_mb, rank0)
    wall = time.monotonic() - run.started
    rank = _rank_result(stream, rank0, config, pid=run.proc.pid, wall_s=wall, peak_mb=peak_mb)
    if rank0.probe:  # the first measurement's run (``script.first_measurement``)
        rank.limit = {"phases": phases(rank0.probe, rank.steps, config.accumulation_steps)}
    return TrialResult(ranks=[rank], wall_s=wall)


#: The probe's kinds written once per forward pass; the others once per optimizer step.
PER_FORWARD = ("f",)


def phases(
    probe: Mapping[str, Sequence[float]], forwards: int, accumulation_steps: int = 1
) -> dict[str, float]:
    """The median of each of a probe's figures over the measured steps (``core.step_report``'s
    kinds: ``f`` forward seconds, ...): the last ``forwards`` forward passes' for the kinds
    written per forward pass, the last ``forwards / accumulation_steps`` optimizer steps' for
    the others."""
    steps = max(forwards // max(accumulation_steps, 1), 1)
    return {
        k: statistics.median(v[-(max(forwards, 1) if k in PER_FORWARD else steps) :])
        for k, v in probe.items()
        if v
    }


class Launch:
    """One start of the command on this machine, as a context: the trial's directory (its
    profile, the ranks' reports, and the log unless ``log`` names one), the command started
    under the guard with the trial's environment; ``end`` ends it (also on leaving), and the
    directory is removed on leaving."""

    def __init__(
        self,
        command: Sequence[str],
        config: TrialConfig,
        world_size: int,
        backend: str,
        log: Path | None,
        cwd: str | os.PathLike[str] | None,
        env: Mapping[str, str] | None,
    ) -> None:
        self.started = time.monotonic()
        self._tmp = _trial_dir()
        self._ended = False
        work = Path(self._tmp.name)
        try:
            self.reports = work / "report"
            self.reports.mkdir()
            path = _save_profile(config, world_size, backend, work / "trial.yaml")
            base = os.environ if env is None else env
            ours = {PROFILE_ENV: str(path), REPORT_ENV: str(self.reports)}
            child_env = {**base, **config.env, **ours}
            self.log = log or work / "script.log"
            self.log.parent.mkdir(parents=True, exist_ok=True)
            self._out = open_log(self.log)
        except BaseException:
            self._tmp.cleanup()
            raise
        try:
            self._pump = logfile.Pump(self._out, self.log)
            try:
                self.proc = _start(command, child_env, cwd, self._pump.write_fd, work)
            finally:
                self._pump.started()
        except BaseException:
            self._out.close()
            self._tmp.cleanup()
            raise

    def exited(self) -> int | None:
        """The command's exit status once it has exited, its output then in the log (up to
        ``DRAIN_S`` waited for it); None while it runs."""
        code = self.proc.poll()
        if code is not None:
            self._pump.drain(DRAIN_S)
        return code

    def end(self) -> None:
        """End the command (once); its output is then in the log (``exited``)."""
        if not self._ended:
            self._ended = True
            try:
                _end(self.proc)
            finally:
                self._pump.drain(DRAIN_S)
                self._out.close()

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.end()
        finally:
            self._tmp.cleanup()


#: A trial's directory is ``<temp>/autotune-script-<pid>-<random>``: the pid of the process that
#: removes it when the trial ends, so that one killed first (a driver killed with -9, a node's
#: worker killed mid-trial) leaves a directory the next trial on that machine can tell is orphaned.
TRIAL_DIR_PREFIX = "autotune-script-"


def _trial_dir() -> tempfile.TemporaryDirectory[str]:
    """A new trial directory named for this process, after removing the orphaned ones."""
    remove_orphans(Path(tempfile.gettempdir()))
    return tempfile.TemporaryDirectory(prefix=f"{TRIAL_DIR_PREFIX}{os.getpid()}-")


def remove_orphans(parent: Path) -> list[Path]:
    """Remove the trial directories under ``parent`` that this user owns and whose process is
    gone; return them. A link, another user's directory, a name without a pid and a live
    process's directory are left alone (``shutil.rmtree`` does not follow links inside)."""
    removed = []
    uid = os.getuid()
    for path in parent.glob(f"{TRIAL_DIR_PREFIX}*-*"):
        pid = path.name[len(TRIAL_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or not script_guard.gone(int(pid)):
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_uid == uid and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def open_log(path: Path) -> IO[bytes]:
    """``path`` opened empty for appending (``O_APPEND``: the cap cuts it in place), never
    through a link: a link planted where the log goes (a directory others can write) would have
    the command's output written into the file it points at. Raises ``TrialFailed`` then."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        raise TrialFailed(
            FailureReason.CRASH,
            f"cannot write the log {path} ({e.strerror}: a link there is not followed); "
            "remove it, or give a directory of your own",
        ) from None
    return os.fdopen(fd, "ab")


def _save_profile(config: TrialConfig, world_size: int, backend: str, path: Path) -> Path:
    """Save the trial's configuration as a profile at ``path`` (the command's
    ``AUTOTUNE_PROFILE``); where it was saved."""
    from autotune.profile.profile import Profile

    profile = Profile.from_config(
        config,
        where="trial",
        study={"name": "script-trial"},
        workload={
            "trainer": "script",
            "world_size": world_size,
            "backend": backend,
            "global_batch": config.global_batch,
        },
        hardware={"device": "cuda" if backend == "nccl" else "cpu"},
        measured={
            "baseline_samples_per_s": 1.0,
            "best_samples_per_s": 1.0,
            "speedup": 1.0,
            "note": "a trial's configuration, not a measured profile",
        },
    )
    return profile.save(path)


def _start(
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    out: int,
    work: Path,
) -> subprocess.Popen[bytes]:
    """Start ``command`` under the guard (``autotune.script.guard``, watching this process), in
    a session of its own, its output to the file descriptor ``out``; the guard removes the
    trial's directory ``work`` if this process goes away first (``kill -9``)."""
    guarded = [sys.executable, "-c", GUARD_BOOT, str(os.getpid()), "--remove", str(work), "--"]
    return subprocess.Popen(  # noqa: S603 - the user's own command, as they typed it
        [*guarded, *command],
        env=env,
        cwd=cwd,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _rank_result(
    stream: StepStream,
    rank0: Reports,
    config: TrialConfig,
    *,
    pid: int,
    wall_s: float,
    peak_mb: float,
) -> RankResult:
    """The trial's measurement as one rank's result: ``stream``'s windows, and rank 0's
    reports (``rank0``) for the time before them and the loss."""
    stamps, losses = rank0.stamps, rank0.losses
    window_s = sum(stream.seconds)
    n = stream.counted_steps
    first = stream.warmup_steps or 0
    return RankResult(
        rank=0,
        applied={},
        pid=pid,
        steps=n,
        samples=round(n * stream.samples_per_step),
        window_s=window_s,
        windows=stream.windows,
        steps_per_window=stream.steps_per_window,
        warmup_steps=first,
        stop=stream.stop,
        # before the first window: start-up and warm-up (and, after the windows, the end)
        setup_s=max(0.0, wall_s - window_s),
        warmup_s=stamps[first] - stamps[0],
        measure_s=window_s,
        loss=_mean(losses[-n:]) if losses else math.nan,
        loss_curve=loss_curve(losses, len(stamps), config.accumulation_steps),
        peak_memory_mb=peak_mb,
    )


def _check_memory(rank: int, peak_mb: float, max_memory_mb: float | None) -> None:
    if max_memory_mb is not None and peak_mb > max_memory_mb:
        raise TrialFailed(
            FailureReason.OOM,
            f"rank {rank}: peak memory {peak_mb:.0f} MiB is over --max-memory "
            f"{max_memory_mb:.0f} MiB",
        )


def peak_of_ranks(
    reports: Path, max_memory_mb: float | None, rank0: Reports | None = None
) -> float:
    """The largest peak memory any rank on this machine reported (rank 0's read as it ran
    when given, the others' files read once now); over ``max_memory_mb`` it fails the trial."""
    peak = 0.0 if rank0 is None else rank0.peak_mb
    for path in sorted(reports.glob("rank-*.steps")):
        rank = path.stem.removeprefix("rank-")
        if not rank.isdigit() or (rank0 is not None and rank == "0"):  # read as it ran
            continue
        other = Reports(path)
        while _read(other):
            pass
        _check_memory(int(rank), other.peak_mb, max_memory_mb)
        peak = max(peak, other.peak_mb)
    return peak


def loss_curve(losses: Sequence[float], forwards: int, accumulation_steps: int) -> list[float]:
    """The first ``CURVE_STEPS`` optimizer steps' losses from rank 0's reports: the mean of
    each step's ``accumulation_steps`` micro-step losses when the script reports one loss per
    forward pass (the README's pattern: about as many losses as forwards), the losses as they
    are when it reports one per optimizer step. Empty when the script reports none."""
    a = accumulation_steps
    if a == 1 or len(losses) < 0.75 * forwards:  # one loss per step (or no accumulation)
        return [float(x) for x in losses[:CURVE_STEPS]]
    steps = min(len(losses) // a, CURVE_STEPS)
    return [_mean(losses[k * a : (k + 1) * a]) for k in range(steps)]


def _mean(xs: Sequence[float]) -> float:
    """The mean of reported losses: NaN or infinite where they are (``statistics.fmean``
    raises on an infinity of each sign, or on finite values whose sum overflows)."""
    return sum(xs) / len(xs)


def _watch(
    run: Launch,
    stream: StepStream,
    timeout_s: float,
    wrap_wait_s: float,
    max_memory_mb: float | None = None,
) -> Reports:
    """Poll rank 0's reports until ``stream`` is measured; raise ``TrialFailed`` when the
    command exits first (named by its log's error line, ``error_line``), reports nothing in
    ``wrap_wait_s``, runs past ``timeout_s``, reports a peak memory over ``max_memory_mb``, a
    non-finite loss or a bad report line (``core.step_report``)."""
    rank0 = Reports(run.reports / "rank-0.steps")
    stamps = rank0.stamps
    while True:
        _read(rank0)
        _check_memory(0, rank0.peak_mb, max_memory_mb)
        measured = stream.feed(stamps)
        _check_losses(stream, rank0.losses, len(stamps), measured)
        if measured:
            return rank0
        code = run.exited()
        elapsed = time.monotonic() - run.started
        if code is not None:
            said = error_line(run.log)
            raise TrialFailed(
                FailureReason.CRASH,
                f"the command exited with status {code} before it was measured"
                + (f" ({len(stamps)} steps reported)" if stamps else " (no step reported)")
                + (f": {said}" if said else ""),
            )
        if not stamps and elapsed > wrap_wait_s:
            raise TrialFailed(
                FailureReason.CRASH,
                f"the script reported no step in {wrap_wait_s:.0f}s: wrap the model with "
                f"autotune.Profile.load().wrap(model) so that autotune can time its steps",
            )
        if elapsed > timeout_s:
            raise TrialFailed(
                FailureReason.TIMEOUT, f"not measured after {timeout_s:.0f}s ({len(stamps)} steps)"
            )
        time.sleep(POLL_S)


#: A line of a launcher's failure report, not a rank's own output (torchrun's banner and its
#: fields, its elastic agent's log lines, its traceback).
_LAUNCHER_LINE = re.compile(
    r"^(=+|-+|\[\d+\]:|Failures:|Root Cause|<NO_OTHER_FAILURES>|time\s*:|host\s*:|"
    r"rank\s*:|exitcode\s*:|error_file\s*:|traceback\s*:|Traceback|File |\^|"
    r"[EWI]\d{4} .*torch/distributed/elastic)|ChildFailedError|FAILED$|elastic/"
)
_ERROR = re.compile(r"error|exception|killed|fault|abort|denied|not found|no such", re.I)
_RANK_PREFIX = re.compile(r"^\[(default)?rank\d+\]:\s*")


def error_line(log: str | os.PathLike[str]) -> str:
    """What a failed command's log says went wrong: the last line from a rank's own output
    that names an error, else the last line of it at all (torchrun's failure banner and its
    agent's lines left out; a ``[rankN]:`` prefix dropped); "" when there is none."""
    text = logfile.tail(log, logfile.TAIL_READ).decode(errors="replace")
    own = []
    for line in text.splitlines():
        line = _RANK_PREFIX.sub("", line.strip())
        if line and not line.startswith(script_guard.SAYS) and not _LAUNCHER_LINE.search(line):
            own.append(line)
    named = [line for line in own if _ERROR.search(line)]
    return (named or own or [""])[-1][:300]


def _read(reports: Reports) -> bool:
    """``reports.read()``, a bad line failing the trial (``crash``) in one line."""
    try:
        return reports.read()
    except BadReport as e:
        raise TrialFailed(FailureReason.CRASH, str(e)) from None


def _check_losses(stream: StepStream, losses: list[float], steps: int, measured: bool) -> None:
    """A non-finite loss fails the trial (``nan``) as it does a built-in one's: the last
    loss after the first ``min_warmup_steps`` steps, and the mean over the measured steps."""
    if not losses:
        return
    if measured:
        loss = _mean(losses[-stream.counted_steps :])
        if not math.isfinite(loss):
            raise TrialFailed(
                FailureReason.NAN, f"the script reported loss {loss} over its measured steps"
            )
    elif steps >= stream.measure.min_warmup_steps and not math.isfinite(losses[-1]):
        raise TrialFailed(
            FailureReason.NAN, f"the script reported loss {losses[-1]} after {steps} steps"
        )
