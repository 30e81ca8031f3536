"""Logs that stay bounded and are read from their end.

A trial's output (a rank's ``rank-N.log``, a script trial's ``script.log``) is written by
code autotune does not control, which may print without end. Two rules hold for every log
autotune keeps:

* **Read from the end.** ``tail`` and ``last_line`` seek to the end of a file and read at
  most a bounded number of bytes (``TAIL_READ`` for the last line), whatever its size.
* **The cap.** A log over ``LIMIT.max_bytes`` (64 MiB) is cut to its first
  ``LIMIT.head_bytes`` (8 MiB), a line ``[autotune: N bytes cut here]`` (N: every byte of the
  output cut so far, earlier cuts included), and its last ``LIMIT.tail_bytes`` (8 MiB), in
  place (``cap``), so a log left behind is at most about 16 MiB.
* **Who cuts.** A script trial's command writes into a pipe, and ``Pump`` - the log's only
  writer - copies it into the log and cuts between its own writes: nothing the command
  printed is lost to a cut, its last line (the one a failure is named by) included. A rank's
  own output goes to its log directly (``output_to``: the rank's file descriptors 1 and 2),
  and ``Capper`` cuts beside it once a second and once more when the rank no longer writes;
  the rank opens the log with ``O_APPEND``, so what it writes after a cut goes to the new
  end, but output written in the instant of such a cut (between its last look at the size
  and its truncation) can be lost. A rank's failure is named by its exception; only a rank
  whose process died without one is named by the end of its log
  (``launch.launcher._with_last_words``).

Only the standard library is imported (a rank imports this).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import IO

__all__ = ["LIMIT", "TAIL_READ", "Capper", "Limit", "Pump", "cap", "last_line", "tail"]

#: The most bytes ``last_line`` reads.
TAIL_READ = 64 * 1024
#: Bytes moved at a time by a cut.
_CHUNK = 1 << 20
_MARKER = re.compile(rb"\n\[autotune: (\d+) bytes cut here\]\n")


@dataclass(frozen=True)
class Limit:
    """The cap's rule (see the module doc): over ``max_bytes``, keep the first
    ``head_bytes`` and the last ``tail_bytes``."""

    max_bytes: int
    head_bytes: int
    tail_bytes: int

    def __post_init__(self) -> None:
        if self.head_bytes < 0 or self.tail_bytes < 0:
            raise ValueError(f"{self}: head and tail must not be negative")
        if self.max_bytes < self.head_bytes + self.tail_bytes + 4096:
            raise ValueError(f"{self}: max_bytes must exceed head + tail by 4096 at least")


LIMIT = Limit(max_bytes=64 << 20, head_bytes=8 << 20, tail_bytes=8 << 20)


def tail(path: str | os.PathLike[str], n_bytes: int) -> bytes:
    """The last ``n_bytes`` of ``path`` (all of it when smaller; empty when it is missing),
    read without reading the rest. Only a regular file is read, never through a link and
    never waiting on a FIFO: one swapped in where a log was (a directory others can write)
    gives nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return b""
        f.seek(max(0, info.st_size - n_bytes))
        return f.read(n_bytes)


def last_line(
    path: str | os.PathLike[str],
    *,
    ignore: tuple[str, ...] = (),
    n_bytes: int = TAIL_READ,
    max_chars: int = 300,
) -> str:
    """The last non-blank line of ``path`` that starts with none of ``ignore`` (stripped, at
    most ``max_chars``), from its last ``n_bytes`` only; "" when there is none."""
    text = tail(path, n_bytes).decode(errors="replace")
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith(ignore):
            return line[:max_chars]
    return ""


def cap(path: str | os.PathLike[str], limit: Limit | None = None) -> int:
    """Cut ``path`` by the rule (``limit``, else ``LIMIT``) when it is over the cap; the bytes
    this cut took out (0: none). A missing file, or one that is not a regular file (a link
    is not followed), is left alone."""
    lim = limit or LIMIT
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size <= lim.max_bytes:
            return 0
        return _cut(fd, info.st_size, lim)
    finally:
        os.close(fd)


def _cut(fd: int, size: int, lim: Limit) -> int:
    """Move the last ``tail_bytes`` (and anything written meanwhile) to just after the first
    ``head_bytes`` and a marker line, then truncate; the bytes cut."""
    src = size - lim.tail_bytes
    old = _MARKER.match(os.pread(fd, 64, lim.head_bytes))  # an earlier cut's marker
    earlier, old_len = (int(old.group(1)), len(old.group(0))) if old else (0, 0)
    cut = src - lim.head_bytes
    marker = f"\n[autotune: {earlier + cut - old_len} bytes cut here]\n".encode()
    os.pwrite(fd, marker, lim.head_bytes)
    dst = lim.head_bytes + len(marker)
    while True:
        end = os.fstat(fd).st_size
        while src < end:
            chunk = os.pread(fd, min(_CHUNK, end - src), src)
            if not chunk:
                break
            os.pwrite(fd, chunk, dst)
            src += len(chunk)
            dst += len(chunk)
        if os.fstat(fd).st_size <= end:  # nothing written since: cut here
            break
    os.ftruncate(fd, dst)
    return cut


class Capper:
    """``cap`` on ``path`` every ``every_s`` seconds in a daemon thread, and once more at
    ``close``: for a log whose writer has no loop of its own (a rank's output)."""

    def __init__(self, path: str | os.PathLike[str], every_s: float = 1.0) -> None:
        self.path = path
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-log-cap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(OSError):
                cap(self.path)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(OSError):
            cap(self.path)


class Pump:
    """The one writer of the log ``out`` (a file opened for appending): a thread copies what
    is written into the pipe ``write_fd`` (a child's stdout and stderr) into the log, and
    cuts it by the rule (``limit``, else ``LIMIT``) whenever it is over the cap. No other
    process writes the log, so no cut can lose output (module doc), and the log holds every
    byte that reached the pipe once ``drain`` has returned True.

    The caller gives ``write_fd`` to the child and then calls ``started``, which closes this
    process's copy: the pipe ends, and the thread stops, when the last process holding it does.
    """

    def __init__(
        self, out: IO[bytes], path: str | os.PathLike[str], limit: Limit | None = None
    ) -> None:
        self.path = path
        self.limit = limit or LIMIT
        self._fd = os.dup(out.fileno())  # its own: the caller may close ``out`` before the end
        self._read_fd, self.write_fd = os.pipe()  # neither inherited (PEP 446) but as stdout
        self._thread = threading.Thread(target=self._run, name="autotune-log-pump", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The child has its copy of the pipe: close ours (once)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _run(self) -> None:
        fd = self._fd
        writing = True
        try:
            while chunk := os.read(self._read_fd, 1 << 16):
                if writing:  # after a failed write (the disk full), the pipe is only read
                    try:
                        self._write(fd, chunk)
                    except OSError:
                        writing = False
        finally:
            os.close(self._read_fd)
            os.close(fd)

    def _write(self, fd: int, chunk: bytes) -> None:
        while chunk:
            chunk = chunk[os.write(fd, chunk) :]
        if os.fstat(fd).st_size > self.limit.max_bytes:
            cap(self.path, self.limit)

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every writer of the pipe to have closed it and the log
        to hold all they wrote; whether it does (a process the command left behind may still
        hold the pipe open)."""
        self.started()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
