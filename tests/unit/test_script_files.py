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
