"""The process reaper of a local Ray instance ends what the run started and nothing else: real
processes, started here, stand for the instance's (marked with the run's ``OWNER_ENV`` value)
and for everyone else's. This test process plays the driver."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.launch.reaper import OWNER_ENV, Reaper, read_proc
from tests.conftest import wait_for, with_env

#: Holds a file open and sleeps: a rank reading the user's dataset, or the user's own program.
HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); print('open', flush=True); time.sleep(120)"


def alive(pid: int) -> bool:
    p = read_proc(pid)
    return p is not None and not p.zombie


def marked(owner: str) -> dict[str, str]:
    return {**os.environ, OWNER_ENV: owner}


def holding(argv0: str, path: Path, env: dict[str, str]) -> subprocess.Popen:
    """A Python process started as ``argv0`` with ``path`` open, once it has it open."""
    p = subprocess.Popen([argv0, "-c", HOLD, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "open\n"
    return p


@pytest.fixture
def started():
    """Processes a test starts; each one left is killed and waited for at the end."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def adopting():
    """Reapers that make this process a child subreaper until the test ends, however it ends."""
    reapers: list[Reaper] = []

    def adopt(owner: str, watch_s: float | None = None) -> Reaper:
        reaper = Reaper(owner)
        reaper.adopt(watch_s=watch_s)
        reapers.append(reaper)
        return reaper

    yield adopt
    for reaper in reapers:
        reaper.end(grace_s=0)


def orphan(script: str, env: dict[str, str]) -> int:
    """The PID of what ``script`` (bash) starts in the background and prints: its parent, the
    shell, has exited."""
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    return int(out.stdout.split()[0])


def end_orphan(pid: int) -> None:
    p = read_proc(pid)
    if p is not None and not p.zombie:
        Reaper("-").send(pid, p.start, signal.SIGKILL)


def test_a_users_program_named_like_rays_holding_the_runs_files_is_not_ended(tmp_path, started):
    """H-R01: the user's python in a conda env named ``ray`` (``/ray/`` in its argv[0]) reads
    the same dataset, in a directory named like a Ray session, as a process of the run; and
    another run's process: neither is ended, the run's own is."""
    data = tmp_path / "data" / "session_2026-11-25_06-45-09_749085_100"
    data.mkdir(parents=True)
    (data / "train.bin").write_bytes(b"\0" * 16)
    python = tmp_path / "envs" / "ray" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    ours = holding(sys.executable, data / "train.bin", marked("run-1"))
    users = holding(str(python), data / "train.bin", dict(os.environ))
    other_run = holding(sys.executable, data / "train.bin", marked("run-2"))
    started += [ours, users, other_run]
    assert Path(f"/proc/{users.pid}/cmdline").read_bytes().startswith(str(python).encode())

    killed = Reaper("run-1").end(grace_s=0.2)
    assert killed == [ours.pid]
    assert read_proc(ours.pid) is None  # ended, and reaped
    assert alive(users.pid) and alive(other_run.pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting another user's process needs root")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_another_users_process_with_the_runs_mark_is_not_ended(started):
    """H-R02: run as root, the driver's own child that runs as ``nobody`` and carries the run's
    mark is another user's process: it is not ended; the run's own is."""
    ours = subprocess.Popen(["sleep", "120"], env=marked("run-2"))
    nobody = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "120"],
        env=marked("run-2"),
    )
    started += [ours, nobody]
    assert wait_for(lambda: (p := read_proc(nobody.pid)) is not None and p.uids[0] != 0, 10)

    assert Reaper("run-2").end(grace_s=0.2) == [ours.pid]
    assert read_proc(ours.pid) is None
    assert alive(nobody.pid)


def test_a_marked_process_whose_parent_exited_is_ended_and_reaped(adopting):
    """H-R03: a process of the run whose parent exited first (an agent when the raylet ends)
    stays below the driver, its child subreaper: it is ended, and no zombie is left."""
    reaper = adopting("run-3")
    pid = orphan("sleep 120 >/dev/null 2>&1 & echo $!", marked("run-3"))
    try:
        assert read_proc(pid).ppid == os.getpid()  # adopted, not passed to init
        assert reaper.end(grace_s=0.2) == [pid]
        assert read_proc(pid) is None  # killed and reaped
    finally:
        end_orphan(pid)


def test_a_process_of_the_run_that_lost_its_mark_is_ended_once_recorded(adopting, started):
    """H-R04: what the run started and that no longer shows the mark (an agent renames itself
    and its environment reads back empty) is the run's while its marked parent runs, and
    after that parent exited because it was recorded then."""
    reaper = adopting("run-4")
    shell = subprocess.Popen(
        ["bash", "-c", "env -i sleep 120 >/dev/null 2>&1 & echo $!; read"],
        env=marked("run-4"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(shell)
    agent = int(shell.stdout.readline())
    try:
        assert wait_for(lambda: b"AUTOTUNE" not in Path(f"/proc/{agent}/environ").read_bytes(), 10)
        assert agent in reaper.owned()  # its parent is marked
        reaper.record()
        shell.communicate("\n", timeout=10)  # the parent exits
        assert wait_for(lambda: read_proc(agent).ppid == os.getpid(), 10)
        assert agent in reaper.owned()  # recorded
        assert reaper.end(grace_s=0.2) == [agent]
        assert read_proc(agent) is None
    finally:
        end_orphan(agent)


def test_a_process_outside_the_drivers_tree_with_the_runs_mark_is_not_ended():
    """H-R05: a process that carries the run's mark (copied, or inherited through a process
    that left the driver's tree before) but does not descend from the driver is not ended."""
    pid = orphan("sleep 120 >/dev/null 2>&1 & echo $!", marked("run-5"))
    try:
        assert read_proc(pid).ppid != os.getpid()
        assert Reaper("run-5").end(grace_s=0.2) == []
        assert alive(pid)
    finally:
        end_orphan(pid)


def take_pid(pid: int) -> subprocess.Popen | None:
    """A new process of the user's own with PID ``pid`` (through ``ns_last_pid``), or None."""
    for _ in range(50):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        p = subprocess.Popen(["sleep", "120"])
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK),
    reason="choosing the next PID (/proc/sys/kernel/ns_last_pid) needs root",
)
def test_a_recorded_pid_that_a_new_process_took_is_not_signalled(started):
    """H-R06: a process of the run recorded, then gone; its PID taken by a new process of the
    user's (the PID reused between a scan and the kill): the new one is neither the run's nor
    signalled, because its start time is not the recorded one."""
    reaper = Reaper("run-6")
    first = subprocess.Popen(["sleep", "120"], env=marked("run-6"))
    reaper.record()
    recorded = reaper.recorded[first.pid]
    first.kill()
    first.wait()
    time.sleep(0.05)  # a later start time: /proc counts in clock ticks
    second = take_pid(first.pid)
    assert second is not None, "could not make a process take the PID again"
    started.append(second)
    assert read_proc(second.pid).start != recorded
    assert second.pid not in reaper.owned()
    assert not reaper.send(second.pid, recorded, signal.SIGKILL)
    assert reaper.end(grace_s=0.2) == []
    assert alive(second.pid)


def test_the_watch_reaps_what_the_run_orphaned_while_it_runs(adopting):
    """H-R07: while the instance runs (for hours), a process of the run whose parent died and
    then exited itself becomes the driver's zombie: the watch reaps it, so none pile up."""
    reaper = adopting("run-7", watch_s=0.1)
    pid = orphan("sleep 1 >/dev/null 2>&1 & echo $!", marked("run-7"))
    assert wait_for(lambda: pid in reaper.recorded, 10)
    assert wait_for(lambda: read_proc(pid) is None, 10)  # exited and reaped: no zombie


def test_a_second_ctrl_c_while_ray_shuts_down_still_ends_the_runs_processes(started):
    """H-R12: Ctrl-C again while Ray shuts down (its shutdown interrupted): the run's
    processes are killed at once all the same, then the interrupt goes on."""
    ours = subprocess.Popen(["sleep", "120"], env=marked("run-8"))
    started.append(ours)

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Reaper("run-8").end(shutdown=interrupted, grace_s=60)
    assert read_proc(ours.pid) is None


#: Forks a child every millisecond, up to 500 (a raylet forking workers), each sleeping.
SPAWNER = """\
import os, time
for _ in range(500):
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    time.sleep(0.001)
time.sleep(120)
"""


def test_what_a_process_of_the_run_starts_as_it_is_killed_is_ended_too(adopting):
    """H-R13: a process of the run that keeps starting others (the raylet forking a worker)
    can start one between the reaper's look and its own kill; that one is ended as well, so
    nothing of the run is left to write in its temp dir once ``end`` returns."""
    reaper = adopting("run-9")
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER], env=marked("run-9"))
    try:
        assert wait_for(lambda: len(reaper.owned()) > 5, 10)
        killed = reaper.end(grace_s=0)
        assert spawner.pid in killed and len(killed) > 5
        assert reaper.owned() == {}
        assert not [pid for pid in with_env(OWNER_ENV, "run-9") if alive(pid)]
    finally:
        spawner.kill()
        spawner.wait()
        for pid in with_env(OWNER_ENV, "run-9"):
            end_orphan(pid)
