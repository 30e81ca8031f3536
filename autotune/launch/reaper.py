"""Ending what a local Ray instance started here, and nothing else.

A process is this run's (``Reaper.owned``) when all of these hold:

* it runs as this process's user: its real, effective and saved uid are this process's
  effective uid (``/proc/PID/status``), so no other user's process is ever named, also when
  the run is root;
* it descends from this process (parent links of ``/proc/PID/stat``). ``adopt`` makes this
  process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a process whose parent
  exits first (the raylet's workers and agents when the raylet ends) stays a descendant
  instead of passing to init;
* and it carries the run's mark: ``OWNER_ENV`` set to the run's value in its environment, or
  in an ancestor's below this process that is this user's, or it was recorded as the run's
  (``record``: its PID and its start time, field 22 of ``/proc/PID/stat``) and its start time
  still matches. Ray's agents rename themselves, which can leave their environment unreadable;
  they are the raylet's children, and are recorded while the raylet runs.

No path, program name or command line counts. A signal goes through a pidfd
(``os.pidfd_open``) after its start time was checked against the record, so a PID that a
new process took in the meantime is never signalled; without pidfds the start time is checked
right before ``os.kill``. ``end`` kills in rounds until none of the run's is left (for up to
``KILL_WAIT_S``): a process of the run can start another between a look and its own kill (the
raylet forking a worker), and one never killed went on writing in the instance's temp dir
while ``close`` removed it. Zombies that the subreaper made this process's children are reaped
(``os.waitpid`` on their PIDs only, never on the processes Ray started from this one and waits
for itself), while the instance runs (every ``WATCH_S``: a process below a rank actor that
Ray replaced is orphaned, and a run lasts hours) and when it ends. Elsewhere than Linux
nothing is found and nothing is ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KILL_WAIT_S",
    "OWNER_ENV",
    "REAP_GRACE_S",
    "WATCH_S",
    "Proc",
    "Reaper",
    "read_proc",
    "subreaper",
]

#: The environment variable that marks the processes of a local instance started here.
OWNER_ENV = "AUTOTUNE_RAY_OWNER"
#: Seconds the run's processes get to end by themselves after Ray's shutdown.
REAP_GRACE_S = 1.5
#: Seconds the kills get to take effect (and to catch what the killed started meanwhile).
KILL_WAIT_S = 3.0
#: Seconds between two looks at the instance while it runs (recording its processes, reaping
#: the zombies the subreaper gave this process).
WATCH_S = 5.0
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc`` shows it."""

    pid: int
    ppid: int
    start: int
    """Its start time in clock ticks since boot: with the PID, who it is."""
    uids: tuple[int, ...]
    """Real, effective, saved and filesystem uid."""
    zombie: bool


def read_proc(pid: int, proc: Path = PROC) -> Proc | None:
    """``pid`` as ``/proc`` shows it now; None when it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3, the state, on
    uid_line = next((x for x in status.splitlines() if x.startswith("Uid:")), "Uid:")
    return Proc(
        pid=pid,
        ppid=int(fields[1]),
        start=int(fields[19]),
        uids=tuple(int(u) for u in uid_line.split()[1:]),
        zombie=fields[0] in ("Z", "X"),
    )


def _table(proc: Path) -> dict[int, Proc]:
    out = {}
    for entry in proc.glob("[0-9]*"):
        if entry.name.isdigit() and (p := read_proc(int(entry.name), proc)) is not None:
            out[p.pid] = p
    return out


def subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper or stop being one; whether it was one before
    (None where the kernel has no such thing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
            return None
        if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(was.value)


class Reaper:
    """The processes of the local instance that this process started, marked ``owner``."""

    def __init__(self, owner: str, proc: Path = PROC) -> None:
        self.owner = owner
        self.proc = proc
        self.me = os.getpid()
        self.uid = os.geteuid()
        self.recorded: dict[int, int] = {}
        """PID -> start time of the processes recorded as the run's."""
        self.adopted: dict[int, int] = {}
        """Those recorded (PID -> start time) that this process did not start itself: it
        never waits for them, so it reaps them once the subreaper made them its children."""
        self.own: set[int] = set()
        """This process's children as the instance started (Ray's own, which Ray waits for)."""
        self._was: bool | None = None
        self._lock = threading.Lock()  # the watch's thread records and reaps too
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def adopt(self, watch_s: float | None = WATCH_S) -> None:
        """Become a child subreaper (until ``end``), and with ``watch_s`` look at the
        instance that often while it runs."""
        self._was = subreaper(True)
        if watch_s is not None:
            self._watch = threading.Thread(
                target=self._watching, args=(watch_s,), name="autotune-reaper", daemon=True
            )
            self._watch.start()

    def _watching(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.record()
                self.reap()
            except Exception as e:  # a look that failed: the next one, and ``end``, remain
                logging.getLogger(__name__).debug("the reaper's look failed: %r", e)

    def _marked(self, pid: int) -> bool:
        needle = f"{OWNER_ENV}={self.owner}".encode()
        try:
            return needle in (self.proc / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            return False

    def _owned(self) -> dict[int, Proc]:
        table = _table(self.proc)
        children: dict[int, list[Proc]] = {}
        for p in table.values():
            children.setdefault(p.ppid, []).append(p)
        out: dict[int, Proc] = {}
        todo = [(self.me, False)]  # (a process, whether it is the run's)
        while todo:
            parent, runs = todo.pop()
            for p in children.get(parent, []):
                if set(p.uids[:3]) != {self.uid}:
                    continue  # another user's, and what runs below it, is not the run's
                ours = not p.zombie and (
                    runs or self._marked(p.pid) or self.recorded.get(p.pid) == p.start
                )
                if ours:
                    out[p.pid] = p
                todo.append((p.pid, ours))
        return out

    def owned(self) -> dict[int, int]:
        """PID -> start time of the run's live processes now (see the module's docstring)."""
        return {pid: p.start for pid, p in self._owned().items()}

    def record(self, started: bool = False) -> None:
        """Record the run's processes now (done while the raylet runs: its agents rename
        themselves, and their environment may no longer read back); ``started``: the
        instance has just started, and this process's children among them are Ray's own."""
        with self._lock:
            now = self._owned()
            self.recorded = {pid: p.start for pid, p in now.items()}
            if started:
                self.own = {pid for pid, p in now.items() if p.ppid == self.me}
            self.adopted.update({pid: p.start for pid, p in now.items() if pid not in self.own})
            for pid in self.own:
                self.adopted.pop(pid, None)

    def send(self, pid: int, start: int, sig: int) -> bool:
        """Send ``sig`` to ``pid`` if it is still the process that started at ``start``."""
        fd = None
        with contextlib.suppress(AttributeError, OSError):
            fd = os.pidfd_open(pid)
        try:
            p = read_proc(pid, self.proc)
            if p is None or p.start != start or p.zombie:
                return False
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
            return True
        except OSError:  # gone meanwhile
            return False
        finally:
            if fd is not None:
                os.close(fd)

    def reap(self, pids: dict[int, int] | None = None) -> None:
        """Reap those of ``pids`` (PID -> start time; the adopted ones) that are zombies and
        this process's children; forget those gone."""
        with self._lock:
            for pid, start in list((self.adopted if pids is None else pids).items()):
                p = read_proc(pid, self.proc)
                if p is not None and p.start == start and p.zombie and p.ppid == self.me:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                    p = read_proc(pid, self.proc)
                if p is None or p.start != start:
                    self.adopted.pop(pid, None)

    def end(
        self, shutdown: Callable[[], object] = lambda: None, grace_s: float = REAP_GRACE_S
    ) -> list[int]:
        """Record the run's processes, ``shutdown`` (Ray's), give what is left ``grace_s`` to
        end, kill the rest, reap the zombies, stop being a subreaper; the PIDs killed."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
        killed: dict[int, int] = {}
        stopped: BaseException | None = None
        try:
            self.record()
            try:
                shutdown()
            except BaseException as e:  # Ray's error, or a second Ctrl-C: no grace then
                stopped = e
            until = time.monotonic() + (grace_s if stopped is None else 0)
            while self.owned() and time.monotonic() < until:
                self.reap()
                time.sleep(0.1)
            # Kill in rounds until none is left: a process of the run can start one more
            # (a worker the raylet forks) between a look and its own kill, and that one, never
            # killed, would go on writing in the instance's temp dir as it is removed.
            until = time.monotonic() + KILL_WAIT_S
            while (left := self.owned()) and time.monotonic() < until:
                for pid, s in left.items():
                    if killed.get(pid) != s and self.send(pid, s, signal.SIGKILL):
                        killed[pid] = s
                time.sleep(0.05)
            self.reap()
            self.reap({pid: s for pid, s in killed.items() if pid not in self.own})
        finally:
            if self._was is False:
                subreaper(False)
        if killed:
            logging.getLogger(__name__).info(
                "killed %d process(es) Ray left: %s", len(killed), sorted(killed)
            )
        if stopped is not None:
            raise stopped
        return sorted(killed)
