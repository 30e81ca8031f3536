"""Files autotune writes in directories the user named are opened without following links, and
the run directory it makes is private (docs/security.md, H-W04 to H-W06)."""

from __future__ import annotations

import os
import stat

import pytest

from autotune.core.errors import TrialFailed
from autotune.rank.env import output_to
from autotune.script.command import open_log
from autotune.tuner import make_private_dir


def test_h_w04_a_script_log_planted_as_a_link_is_not_written_through(tmp_path):
    """H-W04: ``--log-dir`` of compare, or a trial's log directory: ``run-1-A/script.log`` a
    link to a file of the user's."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    log = tmp_path / "run-1-A" / "script.log"
    log.parent.mkdir()
    log.symlink_to(victim)
    with pytest.raises(TrialFailed, match="a link there is not followed"):
        open_log(log)
    assert victim.read_text() == "keep me"
    plain = tmp_path / "script.log"
    plain.write_text("old")
    with open_log(plain) as f:  # a file of its own is emptied and appended to
        f.write(b"new\n")
    assert plain.read_text() == "new\n"
    assert stat.S_IMODE(plain.stat().st_mode) in (0o600, 0o644)  # the user's, as it was


def test_h_w05_a_rank_log_planted_as_a_link_leaves_the_output_where_it_was(tmp_path):
    """H-W05."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (tmp_path / "rank-0.log").symlink_to(victim)
    with output_to(str(tmp_path), 0):
        os.write(1, b"")  # the output was not redirected into the link
    assert victim.read_text() == "keep me"


def test_h_w06_the_run_directory_autotune_makes_is_private(tmp_path):
    """H-W06."""
    run_dir = tmp_path / "home" / ".autotune"
    old = os.umask(0o022)
    try:
        make_private_dir(run_dir)
    finally:
        os.umask(old)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    make_private_dir(mine)  # one that exists is left as its owner set it
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755


def test_h_w08_a_log_swapped_for_a_link_or_a_fifo_is_not_read(tmp_path):
    """H-W08: the end of a log, read for a failure's line, from a directory others can write:
    a link to a file of the user's gives nothing (its secret line was the failure's reason),
    a FIFO does not hang the run."""
    from autotune.core.logfile import tail
    from autotune.script.command import error_line

    secret = tmp_path / "secret"
    secret.write_text("error: the user's secret\n")
    (tmp_path / "script.log").symlink_to(secret)
    assert tail(tmp_path / "script.log", 1000) == b""
    assert error_line(tmp_path / "script.log") == ""
    os.mkfifo(tmp_path / "fifo.log")
    assert tail(tmp_path / "fifo.log", 1000) == b""  # at once: no writer is waited for


def test_a_trial_directory_whose_process_is_gone_is_removed_and_nothing_else(tmp_path):
    """A script trial's directory outlives a process killed with -9; the next trial removes it.
    A live process's directory, a link named like an orphan and a directory without a pid stay,
    and the link's target is not touched."""
    import subprocess
    import sys

    from autotune.script.command import TRIAL_DIR_PREFIX, remove_orphans

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{TRIAL_DIR_PREFIX}{dead.pid}-abc"
    (orphan / "report").mkdir(parents=True)
    (orphan / "trial.yaml").write_text("x")
    mine = tmp_path / f"{TRIAL_DIR_PREFIX}{os.getpid()}-def"
    mine.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / f"{TRIAL_DIR_PREFIX}{dead.pid}-link"
    link.symlink_to(target)
    unnamed = tmp_path / f"{TRIAL_DIR_PREFIX}x-old"
    unnamed.mkdir()

    assert remove_orphans(tmp_path) == [orphan]
    assert not orphan.exists()
    assert mine.is_dir() and link.is_symlink() and unnamed.is_dir()
    assert (target / "keep").read_text() == "x"
