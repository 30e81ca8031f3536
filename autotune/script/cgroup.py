"""Script mode: the cgroup v2 group the guard (``autotune.script.guard``) contains a command
in, where one can be made: under this process's own group (the ``cgroup2`` mount from
``/proc/self/mountinfo``, the group from ``/proc/self/cgroup``'s ``0::`` line), with
``cgroup.kill`` (Linux 5.14). The guard's module doc says how it is used."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from pathlib import Path

__all__ = ["CGROUP_ENV", "Group", "group_dir", "make_group"]

#: ``0`` in the environment: contain the command by subreaper alone, no cgroup.
CGROUP_ENV = "AUTOTUNE_GUARD_CGROUP"


class Group:
    """A cgroup v2 group of the command's own (the module doc): ``path`` in the mount,
    ``name`` as ``/proc/PID/cgroup`` shows it."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name

    def enter(self) -> None:
        """Move the calling process into the group (the command's, before it runs)."""
        (self.path / "cgroup.procs").write_text("0")

    def holds(self, pid: int) -> bool:
        try:
            return f"0::{self.name}\n" in Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        return []

    def populated(self) -> bool:
        try:
            return "populated 0" not in (self.path / "cgroup.events").read_text()
        except OSError:
            return False

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")

    def remove(self, deadline: float) -> None:
        while True:
            with contextlib.suppress(OSError):  # busy for a moment after its last process
                self.path.rmdir()
            if not self.path.exists() or time.monotonic() > deadline:
                return
            time.sleep(0.01)


def make_group() -> Group | str:
    """A new cgroup v2 group under this process's own, or why none can be made."""
    if os.environ.get(CGROUP_ENV) == "0":
        return f"{CGROUP_ENV}=0"
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        own = next(line[3:] for line in lines if line.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return "this process is in no cgroup v2 group"
    where = group_dir(own, mounts)
    if where is None:
        return f"no cgroup2 mount holds this process's group {own}"
    leaf = f"autotune-guard-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        (where / leaf).mkdir()
    except OSError as e:
        return f"cannot make a group in {where}: {e.strerror}"
    group = Group(where / leaf, f"{own.rstrip('/')}/{leaf}")
    if not (group.path / "cgroup.kill").exists():
        group.remove(time.monotonic())
        return "the kernel has no cgroup.kill (Linux 5.14)"
    return group


def group_dir(own: str, mountinfo: list[str]) -> Path | None:
    """Where the group ``own`` (a ``0::`` path) is in a ``cgroup2`` mount, if one shows it."""
    for line in mountinfo:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right.startswith("cgroup2 "):
            continue
        root, point = (re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), f) for f in fields[3:5])
        if root != "/" and own != root and not own.startswith(root + "/"):
            continue
        rel = own if root == "/" else own.removeprefix(root)
        path = Path(point) / rel.lstrip("/")
        if (path / "cgroup.procs").exists():
            return path
    return None
