"""Script mode, script side: what ``Profile.wrap`` adds when a trial of ``autotune run ... --
CMD`` runs the user's script (``autotune.script.trial`` is the driver's side).

When ``AUTOTUNE_REPORT_DIR`` is set, ``install`` registers a forward pre-hook on the wrapped
model: each forward pass appends a line ``t <time.perf_counter()>`` to
``$AUTOTUNE_REPORT_DIR/rank-<RANK>.steps``, and every ``MEMORY_EVERY``-th (the first
included) also ``m <MiB>``, the rank's peak memory so far: CUDA's peak allocated memory when
the input is on a GPU, else the process's peak resident set (a trial's processes are new,
so it is the trial's own); ``report_loss`` appends ``l <loss>``. A line is
written whole and flushed at once, so the driver reads complete lines while the script runs.
Without the variable (the real job, under ``autotune launch``) nothing is installed and
``report_loss`` does nothing.

The driver reads the files back with ``Reports``. A report is the script's output, so each
line is checked as it is read, and the first that is not what ``install`` and
``report_loss`` write raises ``BadReport`` (the trial fails, naming the file, the line and
what was wrong):

* a line is ``t``, ``l`` or ``m``, one space and a number, at most ``LINE_BYTES`` bytes;
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

__all__ = ["MEMORY_EVERY", "BadReport", "Reports", "install", "report_loss"]

#: Forward passes between two peak-memory lines (one ``getrusage`` or CUDA query each).
MEMORY_EVERY = 8

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


def install(model: Any) -> bool:
    """Time each forward pass of ``model`` for the driver; True when installed."""
    out = _file()
    if out is None:
        return False

    count = 0

    def stamp(module: Any, args: Any) -> None:  # on the script's hot path: one write
        nonlocal count
        out.write(f"t {time.perf_counter()!r}\n")
        if count % MEMORY_EVERY == 0:
            out.write(f"m {_peak_mb(args):.1f}\n")
        count += 1

    model.register_forward_pre_hook(stamp)
    return True


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
        if x is None or kind not in (b"t", b"l", b"m"):
            raise self._bad(f"{line[:LINE_BYTES].decode(errors='replace')!r} is not "
                            "'t|l|m NUMBER'")  # fmt: skip
        if kind == b"l":
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
