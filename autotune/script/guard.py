"""Script mode: the guard between the driver and the user's command.

``python -m autotune.script.guard DRIVER_PID [--remove DIR] -- CMD ...`` is what
``script.command.run_script`` starts (its DRIVER_PID is the process that starts it: the driver,
or the Ray task's worker; DIR the trial's directory, removed if the driver goes away first).
It is two processes. The front, which the driver sees, forks the keeper and waits for it,
exiting with its status (128 + N for a signal N). The keeper makes itself a child subreaper
(Linux ``PR_SET_CHILD_SUBREAPER``) and starts the command in a process group of its own:
every process the command starts stays its descendant even when its parent exits first -
torchrun puts each worker in a session of its own, so the process group alone does not hold
them. The keeper ends all of them:

* when the front receives SIGTERM (the driver ends the trial) and passes it on;
* when the driver goes away without ending the trial (``kill -9``, a crash): the front's
  parent changes, and the front tells the keeper;
* when the front is killed outright: Ray SIGKILLs a dead worker's direct children, which
  would leave a one-process guard no chance to clean up; the keeper, a grandchild, sees its
  parent change;
* when the command exits while processes it started still run.

**How the command is contained.** Where a cgroup v2 group can be made, the keeper makes one
of the command's own under its own group (the ``cgroup2`` mount from ``/proc/self/mountinfo``,
the group from ``/proc/self/cgroup``'s ``0::`` line; this needs write access there, root
most often, and ``cgroup.kill``, Linux 5.14), and the command's process enters it before it
runs (``cgroup.procs``): everything it starts is born in the group. Ending is SIGTERM to the
group's processes, then after ``GRACE_S`` ``cgroup.kill`` - SIGKILL to all of them at once,
new forks included - until ``cgroup.events`` says ``populated 0``; then the group is removed.
Elsewhere (not root, cgroup v1 only, an old kernel), or with ``AUTOTUNE_GUARD_CGROUP=0`` in
the environment, it is by subreaper alone: SIGTERM to every descendant, then after
``GRACE_S`` SIGKILL to the keeper's children and their process groups (a process group at
once, which a fork inside it cannot escape), over and over, reaping, until ``waitpid`` says
there is no child left: with a subreaper every orphan becomes the keeper's child, so no
child means no descendant. The subreaper loop also runs after the cgroup's kill, for any
process that left the group. The keeper says which it used in one line of the script's log
(``autotune guard: containing the command in cgroup ...`` or ``... by subreaper (why)``).

No process is signalled by a pid that may be someone else's: the front signals the keeper
through a pidfd (``os.pidfd_open``, taken while the keeper cannot have been reaped), the
keeper its own children by pid before it reaps them, and any other process through a pidfd
taken before it checks that the process is still the command's.

So no process of the user's script outlives its trial.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from autotune.script.cgroup import Group, make_group

POLL_S = 0.2
GRACE_S = 3.0
#: How long the keeper goes on killing after ``GRACE_S`` before it gives up (a process in an
#: uninterruptible sleep cannot be killed).
KILL_S = 5.0
PR_SET_CHILD_SUBREAPER = 36
#: How the guard's own lines in the script's log begin.
SAYS = "autotune guard:"


class _Stop(Exception):
    """SIGTERM, in the guard's two processes."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name: [state, ppid, pgid, ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _tree() -> dict[int, list[int]]:
    """Every live process's children, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = _stat(proc.name)
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(proc.name))
    return children


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, from ``/proc``."""
    children = _tree()
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _below(pid: int, root: int) -> bool:
    """Whether ``pid`` is a descendant of ``root`` now."""
    for _ in range(1 << 16):
        try:
            pid = int(_stat(pid)[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid == root:
            return True
        if pid <= 1:
            return False
    return False


def _signal_if(pid: int, sig: int, ours: Callable[[int], bool]) -> None:
    """``sig`` to ``pid`` if it is still one of the command's (``ours``): a pidfd taken first
    names the process whatever happens to the number after the check."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (OSError, AttributeError):  # no pidfds here: the check alone
        fd = -1
    with contextlib.suppress(ProcessLookupError):
        if ours(pid) and fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        elif ours(pid):
            os.kill(pid, sig)
    if fd >= 0:
        os.close(fd)


def _children() -> list[int]:
    """This process's children now (the keeper is one thread)."""
    me = os.getpid()
    try:
        return [int(x) for x in Path(f"/proc/{me}/task/{me}/children").read_text().split()]
    except OSError:  # a kernel without the file: scan
        return _tree().get(me, [])


def _reaped_all() -> bool:
    """Reap every child that has exited; True when there is no child left at all."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        return True
    return False


def _kill_children(deadline: float) -> bool:
    """SIGKILL to the keeper's children and their process groups (not its own), reaping,
    until there is no child (True) or ``deadline`` (False). A child is signalled by pid
    only before it is reaped here; its group's id is its pid's or a live group's."""
    own = os.getpgrp()
    spins = 0
    while not _reaped_all():
        for pid in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError, IndexError, ValueError):
                group = int(_stat(pid)[2])
                if group != own:
                    os.killpg(group, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        spins += 1
        if spins > 100:
            time.sleep(0.001)
    return True


def end_all(group: Group | None) -> None:
    """End every process of the command (the module doc): SIGTERM, then after ``GRACE_S``
    the group's kill and the subreaper's SIGKILL loop, within ``KILL_S`` more."""
    me = os.getpid()
    if group is not None:
        for pid in group.pids():
            _signal_if(pid, signal.SIGTERM, group.holds)
    for pid in descendants(me):
        _signal_if(pid, signal.SIGTERM, lambda p: _below(p, me))
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and not (_reaped_all() and not _populated(group)):
        time.sleep(0.02)
    deadline = time.monotonic() + KILL_S
    if group is not None:
        group.kill()
        while _populated(group) and time.monotonic() < deadline:
            _reaped_all()
            time.sleep(0.005)
    if not _kill_children(deadline):
        _say(f"processes of the command still run after {GRACE_S + KILL_S:.0f}s")
    if group is not None:
        group.remove(deadline + 1)


def _populated(group: Group | None) -> bool:
    return group is not None and group.populated()


def _say(what: str) -> None:
    print(f"{SAYS} {what}", file=sys.stderr, flush=True)


USAGE = "usage: python -m autotune.script.guard DRIVER_PID [--remove DIR] -- CMD ..."


def main(argv: list[str]) -> int:
    remove = argv[2] if len(argv) > 3 and argv[1] == "--remove" else None
    if remove is not None:
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    driver = int(argv[0])
    signal.signal(signal.SIGTERM, _stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until each side can stop
    keeper = os.fork()
    if keeper == 0:  # the keeper: its parent is this front from now on
        os._exit(_keep(os.getppid(), argv[2:], remove, driver))
    try:
        pidfd = os.pidfd_open(keeper)  # the keeper is not reaped yet: this names it for good
    except (OSError, AttributeError):
        pidfd = -1
    return _front(driver, keeper, pidfd, remove)


def _front(driver: int, keeper: int, pidfd: int, remove: str | None = None) -> int:
    """The front: what the driver (or the Ray task) started and signals. It passes SIGTERM on
    to the keeper, and tells it when the driver went away, then exits with its status. When
    the front itself is killed outright (Ray kills a dead worker's direct children with
    SIGKILL), the keeper sees its parent change and ends the command alone. ``remove``: the
    trial's directory, which a driver that went away cannot remove: each of the two removes it
    once the command has ended if the driver is gone by then (the driver reads the trial's
    reports from it after the command ends)."""
    told = False
    while True:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            try:
                pid, status = os.waitpid(keeper, 0 if told else os.WNOHANG)
            except ChildProcessError:  # reaped by the wait a SIGTERM interrupted
                return 128 + signal.SIGTERM
            if pid:
                if os.getppid() != driver:
                    _remove(remove)
                return _status(os.waitstatus_to_exitcode(status))
            if os.getppid() != driver:  # the driver died without ending the trial
                told = _tell(pidfd, keeper)
            else:
                time.sleep(POLL_S)
        except _Stop:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            told = _tell(pidfd, keeper)


def _tell(pidfd: int, keeper: int) -> bool:
    """SIGTERM to the keeper: through its pidfd, which fails rather than signal another
    process once the keeper is reaped (by pid only where the kernel has no pidfds)."""
    with contextlib.suppress(ProcessLookupError):
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        else:
            os.kill(keeper, signal.SIGTERM)
    return True


def _keep(front: int, cmd: list[str], remove: str | None = None, driver: int = 0) -> int:
    """The keeper: a child subreaper that runs the command and ends all it started; then
    removes ``remove`` if the driver (pid ``driver``) is gone (``_front``)."""
    with contextlib.suppress(OSError, AttributeError):  # Linux; elsewhere the group only
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    code: int = 1
    group: Group | str | None = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        group = make_group()  # before the command starts: end_all then knows of it
        proc = _start(cmd, group)
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if os.getppid() != front:  # the front was killed: nobody will end the trial
                    break
    except _Stop:
        code = 128 + signal.SIGTERM
    except OSError as e:  # the command cannot be started
        print(f"autotune: cannot start {cmd[0]}: {e.strerror}", file=sys.stderr, flush=True)
        code = 127
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_all(group if isinstance(group, Group) else None)
        if gone(driver):
            _remove(remove)
    return _status(code)


def gone(pid: int) -> bool:
    """Whether no process ``pid`` runs (a reused pid reads as running: nothing is removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _remove(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def _start(cmd: list[str], group: Group | str) -> subprocess.Popen[bytes]:
    """Start the command in a process group of its own, in ``group`` where one was made (else
    ``group`` says why not), and say which (the module doc). A group the command cannot enter
    is removed; ``end_all`` then finds it empty."""
    if isinstance(group, Group):
        _say(f"containing the command in cgroup {group.path}")
        try:
            return subprocess.Popen(cmd, process_group=0, preexec_fn=group.enter)
        except subprocess.SubprocessError as e:  # the command could not enter the group
            group.remove(time.monotonic() + 1)
            group = f"it could not enter the cgroup: {e}"
    _say(f"containing the command by subreaper ({group})")
    return subprocess.Popen(cmd, process_group=0)


def _status(code: int) -> int:
    """An exit status as a shell gives it: 128 + N for a process ended by signal N."""
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
