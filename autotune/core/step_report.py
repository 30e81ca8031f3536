"""Script mode, script side: what ``Profile.wrap`` adds when a trial of ``autotune run ... --
CMD`` runs the user's script (``autotune.script.command`` is the driver's side).

When ``AUTOTUNE_REPORT_DIR`` is set, ``install`` registers a forward pre-hook on the wrapped
model: each forward pass appends a line ``t <time.perf_counter()>`` to
``$AUTOTUNE_REPORT_DIR/rank-<RANK>.steps``, and every ``MEMORY_EVERY``-th (the first
included) also ``m <MiB>``, the rank's peak memory so far: CUDA's peak allocated memory when
the input is on a GPU, else the process's peak resident set (a trial's processes are new,
so it is the trial's own); ``report_loss`` appends ``l <loss>``. A line is
written whole and flushed at once, so the driver reads complete lines while the script runs.
Without the variable (the real job, under ``autotune launch``) nothing is installed and
``report_loss`` does nothing.

**The first measurement** (``PROBE_ENV`` set too, for one run of the defaults): ``install`` also
times where each step goes (``_Probe``): the forward pass (a forward hook), the backward up to
DDP's last bucket being ready (DDP calls its comm hook for each bucket as its gradients are
ready; the probe registers torch's own ``allreduce_hook`` wrapped to note the time and bytes),
the all-reduce that is still running after that (the exposed communication: until the last
bucket's future completes), and the optimizer (torch's global optimizer step hooks). At the
next forward pass it writes the step's ``f`` forward, ``b`` backward, ``x`` exposed, ``o``
optimizer seconds, ``g`` gradient bytes, ``k`` buckets and ``z`` the last bucket's bytes. A
model wrapped with a comm hook of its own is timed without the all-reduce lines.

The driver reads the files back with ``Reports``. A report is the script's output, so each
line is checked as it is read, and the first that is not what ``install`` and
``report_loss`` write raises ``BadReport`` (the trial fails, naming the file, the line and
what was wrong):

* a line is ``t``, ``l``, ``m`` or a probe's kind (``PROBE_KINDS``), one space and a number,
  at most ``LINE_BYTES`` bytes; a probe's number is finite and in ``[0, MAX_PROBE]``;
* a time stamp is finite, in ``[0, MAX_STAMP)`` seconds (``time.perf_counter``), and at least
  ``MIN_STEP_S`` after the one before (a forward pass takes longer), so that step times and
  windows are positive and samples per second finite;
* a peak memory is finite, in ``[0, MAX_MB]``;
* a loss is any number: NaN and infinities are kept, and fail the trial as ``nan``;
* a file holds at most ``MAX_LINES`` lines; each read takes at most ``READ_BYTES``.
"""

from __future__ import annotations

import math
import os
import resource
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["MEMORY_EVERY", "PROBE_ENV", "BadReport", "Reports", "install", "report_loss"]

#: Forward passes between two peak-memory lines (one ``getrusage`` or CUDA query each).
MEMORY_EVERY = 8
#: Set (to 1) for the run of the first measurement: ``install`` times each step's phases.
PROBE_ENV = "AUTOTUNE_PROBE"
#: The probe's line kinds: seconds of forward, backward, exposed all-reduce, optimizer; the
#: step's gradient bytes, its buckets, the last bucket's bytes.
PROBE_KINDS = ("f", "b", "x", "o", "g", "k", "z")

_OUT: dict[str, TextIO] = {}


def _file() -> TextIO | None:
    where = os.environ.get("AUTOTUNE_REPORT_DIR")
    if not where:
        return None
    if where not in _OUT:
        rank = os.environ.get("RANK")
        if rank is None:
            import torch.distributed as dist

            rank = str(dist.get_rank()) if dist.is_initialized() else "0"
        _OUT[where] = open(  # noqa: SIM115 - open for the life of the process
            os.path.join(where, f"rank-{int(rank)}.steps"), "a", buffering=1
        )
    return _OUT[where]


def install(model: Any, *, hook_free: bool = True) -> bool:
    """Time each forward pass of ``model`` for the driver; True when installed. With
    ``PROBE_ENV`` set, each step's phases too (the module doc); ``hook_free``: the model has
    no comm hook of its own, so the probe may time the all-reduce with one."""
    out = _file()
    if out is None:
        return False
    probe = _Probe(out, model, hook_free) if os.environ.get(PROBE_ENV) else None
    count = 0

    def stamp(module: Any, args: Any) -> None:  # on the script's hot path: one write
        nonlocal count
        if probe is not None:
            probe.step_begins()
        out.write(f"t {time.perf_counter()!r}\n")
        if count % MEMORY_EVERY == 0:
            out.write(f"m {_peak_mb(args):.1f}\n")
        count += 1

    model.register_forward_pre_hook(stamp)
    return True


class _Probe:
    """One rank's step phases for the first measurement (the module doc). The comm hook's
    future completes on another thread: it only notes a time; every line is written on the
    script's own thread, at the next forward pass."""

    def __init__(self, out: TextIO, model: Any, hook_free: bool) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.out = out
        self.t: dict[str, float] = {}
        self.optimizer_s = 0.0
        self.stepped = False
        self.cuda = False  # the model's outputs are on a GPU: its marks wait for the device
        self.grad_bytes = self.buckets = self.last_bytes = 0
        model.register_forward_hook(self._forward_ends)
        register_optimizer_step_pre_hook(self._optimizer_begins)
        register_optimizer_step_post_hook(self._optimizer_ends)
        self.timed_comm = hook_free and hasattr(model, "register_comm_hook")
        if self.timed_comm:  # a lambda: DDP refuses a hook whose annotations are not its types
            model.register_comm_hook(None, lambda state, bucket: self._allreduce(state, bucket))

    def _now(self) -> float:
        """A mark's time; on a GPU once the device has finished what was queued (its kernels
        run after the CPU returns, and NCCL's futures complete when queued)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        self.cuda = self.cuda or bool(getattr(output, "is_cuda", False))
        self.t["forward_end"] = self._now()

    def _optimizer_begins(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.t["optimizer"] = time.perf_counter()

    def _optimizer_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if "optimizer" in self.t:
            self.optimizer_s += time.perf_counter() - self.t.pop("optimizer")
            self.stepped = True

    def _allreduce(self, state: Any, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        self.grad_bytes += nbytes
        self.buckets += 1
        if not bucket.is_last():
            return default_hooks.allreduce_hook(state, bucket)
        self.t["last_ready"] = self._now()  # before its all-reduce is queued
        self.last_bytes = nbytes
        fut = default_hooks.allreduce_hook(state, bucket)

        def done(f: Any) -> Any:
            self.t["comm_done"] = self._now()
            return f.value()

        return fut.then(done)

    def step_begins(self) -> None:
        """A forward pass begins: write the step before it, where it was timed whole."""
        t, out = self.t, self.out
        if "start" in t and "forward_end" in t:
            out.write(f"f {t['forward_end'] - t['start']!r}\n")
            if self.timed_comm and "last_ready" in t and "comm_done" in t:
                out.write(f"b {max(t['last_ready'] - t['forward_end'], 0.0)!r}\n")
                out.write(f"x {max(t['comm_done'] - t['last_ready'], 0.0)!r}\n")
                out.write(f"g {self.grad_bytes}\nk {self.buckets}\nz {self.last_bytes}\n")
            if self.stepped:  # once per optimizer step, not per micro-step
                out.write(f"o {self.optimizer_s!r}\n")
        self.t = {"start": time.perf_counter()}
        self.optimizer_s = 0.0
        self.stepped = False
        self.grad_bytes = self.buckets = 0


def _peak_mb(args: Any) -> float:
    """The rank's peak memory so far in MiB: CUDA's peak allocated when the forward's first
    input is on a GPU, else the process's peak resident set (Linux reports KiB)."""
    first = args[0] if isinstance(args, tuple) and args else None
    if getattr(first, "is_cuda", False):
        import torch

        return torch.cuda.max_memory_allocated(first.device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report_loss(loss: Any) -> None:
    """Hand a step's loss to the driver (for the NaN check and the numerics guard)."""
    out = _file()
    if out is not None:
        value = loss.detach() if hasattr(loss, "detach") else loss  # a tensor of the graph
        out.write(f"l {float(value)!r}\n")


#: The checks of a report line (see the module doc).
LINE_BYTES = 64
MIN_STEP_S = 1e-7
MAX_STAMP = 1e12
MAX_MB = 1e9
MAX_LINES = 4_000_000
READ_BYTES = 1 << 20
#: The largest probe figure taken (seconds or bytes).
MAX_PROBE = 1e15


class BadReport(ValueError):
    """A report line that is not what ``install`` and ``report_loss`` write."""


@dataclass
class Reports:
    """A rank's report file read as it grows: each ``read`` parses only the complete lines
    written since the last one (a line being written waits for the next read), at most
    ``READ_BYTES`` at a time, and checks each (the module doc); raises ``BadReport``."""

    path: Path
    stamps: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    peak_mb: float = 0.0
    probe: dict[str, list[float]] = field(default_factory=dict)
    """The first measurement's lines, by kind (``PROBE_KINDS``)."""
    _offset: int = 0
    _lines: int = 0

    def read(self) -> bool:
        """Read what was written since; True when there may be more to read at once."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self._bad(f"cannot be read ({e.strerror})", line=False) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._bad("is not a regular file", line=False)
        with os.fdopen(fd, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(READ_BYTES)
        end = chunk.rfind(b"\n") + 1  # up to the last complete line
        self._offset += end
        for line in chunk[:end].split(b"\n")[:-1]:
            self._lines += 1
            self._take(line)
        if len(chunk) - end > LINE_BYTES:  # a line being written, already too long
            self._lines += 1
            raise self._bad(f"a line longer than {LINE_BYTES} bytes")
        return len(chunk) == READ_BYTES

    def _take(self, line: bytes) -> None:
        if self._lines > MAX_LINES:
            raise self._bad(f"more than {MAX_LINES} lines")
        if len(line) > LINE_BYTES:
            raise self._bad(f"a line longer than {LINE_BYTES} bytes")
        kind, _, value = line.partition(b" ")
        try:
            x = float(value)
        except ValueError:
            x = None
        known = kind in (b"t", b"l", b"m") or kind.decode(errors="replace") in PROBE_KINDS
        if x is None or not known:
            text = line[:LINE_BYTES].decode(errors="replace")
            raise self._bad(f"{text!r} is not 't|l|m NUMBER' (or a probe's line)")
        if kind.decode() in PROBE_KINDS:
            if not 0 <= x <= MAX_PROBE:  # NaN fails this too
                raise self._bad(f"probe figure {x!r} is not a number in [0, {MAX_PROBE:g}]")
            self.probe.setdefault(kind.decode(), []).append(x)
        elif kind == b"l":
            self.losses.append(x)
        elif kind == b"m":
            if not 0 <= x <= MAX_MB:
                raise self._bad(f"peak memory {x!r} MiB is not a number in [0, {MAX_MB:g}]")
            self.peak_mb = max(self.peak_mb, x)
        else:
            self._stamp(x)

    def _stamp(self, t: float) -> None:
        if not (math.isfinite(t) and 0 <= t < MAX_STAMP):
            raise self._bad(f"time stamp {t!r} is not a number of seconds in [0, {MAX_STAMP:g})")
        if self.stamps and not t - self.stamps[-1] >= MIN_STEP_S:
            raise self._bad(
                f"time stamp {t!r} is not after the one before ({self.stamps[-1]!r}) by "
                f"{MIN_STEP_S:g} s at least (do two processes report as this rank?)"
            )
        self.stamps.append(t)

    def _bad(self, what: str, line: bool = True) -> BadReport:
        where = f" line {self._lines}:" if line else ""
        return BadReport(f"step report {self.path.name}{where} {what}")
