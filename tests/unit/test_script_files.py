"""How a multi-node script trial's nodes reach the job's files (``autotune.script.nodes``,
docs/security.md H-S20 to H-S22): a node runs the command in the directory only where it holds
the same files in a directory of the user's that no one else can write; a directory that must
travel carries no link out of itself."""

from __future__ import annotations

import os

import pytest

from autotune.core.errors import ConfigError
from autotune.script.nodes import _sees, directory_size, fingerprint


def job(root):
    root.mkdir(mode=0o755)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "model.py").write_text("W = 1\n")
    return root


def test_h_s20_a_look_alike_copy_elsewhere_is_not_the_same_files(tmp_path):
    """H-S20: the same top-level names and sizes and the same script, but another
    ``pkg/model.py`` of the same size, or the same bytes copied at another time."""
    a = job(tmp_path / "a")
    expected = fingerprint(str(a), "train.py")
    assert _sees(str(a), "train.py", expected)
    b = job(tmp_path / "b")
    (b / "pkg" / "model.py").write_text("W = 2\n")
    assert fingerprint(str(b), "train.py") != expected
    os.utime(a / "pkg" / "model.py", ns=(1, 1))
    assert fingerprint(str(a), "train.py") != expected


def test_h_s21_a_directory_others_can_write_is_not_used_in_place(tmp_path):
    """H-S21."""
    a = job(tmp_path / "a")
    expected = fingerprint(str(a), "train.py")
    os.chmod(a, 0o777)
    assert not _sees(str(a), "train.py", expected)


def test_h_s22_a_link_out_of_a_shipped_directory_is_refused(tmp_path):
    """H-S22: Ray's packing follows links: ``k -> /etc/passwd`` would travel to every node."""
    a = job(tmp_path / "a")
    (a / "inside").symlink_to(a / "train.py")  # a link within it is fine
    assert directory_size(str(a), 1 << 20) > 0
    (a / "k").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="is a link out of"):
        directory_size(str(a), 1 << 20)


def test_the_failure_recorded_for_a_multi_node_trial():
    """Which node's failure a script trial records (``script.nodes._cause``): a lost node
    first; a follower's own error over a leader that was cancelled for it; the leader's own
    error over a follower that only lost its peer; a leader that never answered says so."""
    from autotune.core.errors import FailureReason, TrialFailed
    from autotune.script.nodes import _cause, _Trial

    class Runner:
        aborted = False

    def trial(**failures):
        t = _Trial(Runner(), {}, {})
        t.failures = {int(k[1:]): v for k, v in failures.items()}
        return t

    crash = FailureReason.CRASH
    own = TrialFailed(crash, "node 1: the command exited with status 1: train.py: error: x")
    cancelled = TrialFailed(FailureReason.INTERRUPTED, "stopped by the driver")
    lost = TrialFailed(FailureReason.NODE_LOST, "node 1: its node was lost (...)")
    leader_own = TrialFailed(FailureReason.OOM, "rank 0: peak memory 900 MiB is over ...")
    assert _cause(trial(n0=cancelled, n1=own)) is own
    assert _cause(trial(n0=TrialFailed(crash, "connection reset by peer"), n1=lost)) is lost
    assert _cause(trial(n0=leader_own, n1=own)) is leader_own  # not a crash: the leader's
    assert _cause(trial()).detail == "node 0: its task gave no answer"
