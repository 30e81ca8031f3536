"""Script mode: the guard between the driver and the user's command.

``python -m autotune.script.guard DRIVER_PID -- CMD ...`` is what ``script.trial.run_script``
starts (its DRIVER_PID is the process that starts it: the driver, or the Ray task's worker).
It is two processes. The front, which the driver sees, forks the keeper and waits for it,
exiting with its status (128 + N for a signal N). The keeper makes itself a child subreaper
(Linux ``PR_SET_CHILD_SUBREAPER``) and starts the command: every process the command starts
stays its descendant even when its parent exits first - torchrun puts each worker in a session
of its own, so the process group alone does not hold them. The keeper ends all of them
(SIGTERM, then SIGKILL after ``GRACE_S``):

* when the front receives SIGTERM (the driver ends the trial) and passes it on;
* when the driver goes away without ending the trial (``kill -9``, a crash): the front's
  parent changes, and the front tells the keeper;
* when the front is killed outright: Ray SIGKILLs a dead worker's direct children, which
  would leave a one-process guard no chance to clean up; the keeper, a grandchild, sees its
  parent change;
* when the command exits while processes it started still run.

So no process of the user's script outlives its trial.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.2
GRACE_S = 3.0
PR_SET_CHILD_SUBREAPER = 36


class _Stop(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def end_all() -> None:
    """SIGTERM to every descendant, SIGKILL to those left after ``GRACE_S``."""
    me = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in descendants(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + GRACE_S
        while descendants(me) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.05)
        _reap()
        if not descendants(me):
            return


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m autotune.script.guard DRIVER_PID -- CMD ...", file=sys.stderr)
        return 2
    driver = int(argv[0])
    signal.signal(signal.SIGTERM, _stop)
    try:
        keeper = os.fork()
    except _Stop:
        return 128 + signal.SIGTERM
    if keeper == 0:  # the keeper: its parent is this front from now on
        os._exit(_keep(os.getppid(), argv[2:]))
    return _front(driver, keeper)


def _front(driver: int, keeper: int) -> int:
    """The front: what the driver (or the Ray task) started and signals. It passes SIGTERM on
    to the keeper, and tells it when the driver went away, then exits with its status. When
    the front itself is killed outright (Ray kills a dead worker's direct children with
    SIGKILL), the keeper sees its parent change and ends the command alone."""
    told = False
    while True:
        try:
            pid, status = os.waitpid(keeper, 0 if told else os.WNOHANG)
            if pid:
                return _status(os.waitstatus_to_exitcode(status))
            if os.getppid() != driver:  # the driver died without ending the trial
                os.kill(keeper, signal.SIGTERM)
                told = True
            else:
                time.sleep(POLL_S)
        except _Stop:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper, signal.SIGTERM)
            told = True


def _keep(front: int, cmd: list[str]) -> int:
    """The keeper: a child subreaper that runs the command and ends all it started."""
    with contextlib.suppress(OSError, AttributeError):  # Linux; elsewhere the group only
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    code = 1
    try:
        proc = subprocess.Popen(cmd)  # noqa: S603 - the user's own command
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if os.getppid() != front:  # the front was killed: nobody will end the trial
                    break
    except _Stop:
        code = 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        end_all()
    return _status(code)


def _status(code: int) -> int:
    """An exit status as a shell gives it: 128 + N for a process ended by signal N."""
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
