"""``--address auto`` (or ``RAY_ADDRESS=auto``) joins only a Ray cluster of the user's own
(docs/security.md, H-R13): Ray's ``auto`` joins whichever cluster runs on the machine, and the
driver then unpickles what its workers return."""

from __future__ import annotations

import os

import pytest

from autotune.core.errors import ConfigError
from autotune.launch.address import check_auto_owner, gcs_owners


def fake_proc(root, processes):
    root.mkdir(exist_ok=True)
    """A /proc of ``processes``: (pid, argv[0], uid)."""
    for pid, exe, uid in processes:
        d = root / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(exe.encode() + b"\0--gcs_server_port=6379\0")
        (d / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return root


def test_h_r13_auto_refuses_another_users_cluster_naming_the_owner(tmp_path):
    """H-R13."""
    me, other = os.geteuid(), os.geteuid() + 4242
    proc = fake_proc(
        tmp_path, [(10, "/ray/core/src/ray/gcs/gcs_server", other), (11, "/usr/bin/python3", me)]
    )
    assert gcs_owners(proc) == {other}
    with pytest.raises(
        ConfigError,
        match=rf"--address auto: a Ray cluster running here "
        rf"belongs to .*\(uid {other}\), not to you",
    ):
        check_auto_owner(False, proc)
    with pytest.raises(ConfigError, match="RAY_ADDRESS=auto: .* unset RAY_ADDRESS"):
        check_auto_owner(True, proc)


def test_auto_joins_the_users_own_cluster_and_says_nothing_without_one(tmp_path):
    me = os.geteuid()
    mine = fake_proc(tmp_path / "a", [(12, "/x/gcs_server", me)])
    check_auto_owner(False, mine)  # the user's own alone: joined
    both = fake_proc(tmp_path / "c", [(14, "/x/gcs_server", me), (15, "/x/gcs_server", me + 1)])
    with pytest.raises(ConfigError, match="auto may join it; give your own cluster's address"):
        check_auto_owner(False, both)  # Ray's auto joins the newest: maybe the other's
    (tmp_path / "b").mkdir()
    check_auto_owner(False, tmp_path / "b")  # none: Ray says so itself
    assert gcs_owners(tmp_path / "b") == set()
