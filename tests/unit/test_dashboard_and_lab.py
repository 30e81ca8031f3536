"""Where autotune listens and keeps state: ``autotune dashboard`` refuses a --host beyond
loopback without --expose, a port outside 1-65535 and a port in use, each in one line with exit
2 and no server started; the network lab's private directory is refused when it is a symlink,
not a directory, another user's or open to others."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from autotune import netlab
from autotune.cli.main import main
from autotune.core.errors import ConfigError


@pytest.fixture
def served(monkeypatch):
    """optuna-dashboard's server behind its gate, replaced: the (host, port) each call would
    have served."""
    from autotune.cli import dashboard as gate

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(gate, "serve", lambda url, host, port, token: calls.append((host, port)))
    return calls


@pytest.fixture
def storage(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its INFO line is not the command's
    try:
        optuna.create_study(study_name="s", storage=url)
    finally:
        optuna.logging.set_verbosity(before)
    return url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dashboard(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["dashboard", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1"])
def test_a_host_beyond_loopback_needs_expose(capsys, served, storage, host):
    rc, out, err = dashboard(capsys, "--storage", storage, "--host", host)
    assert rc == 2 and served == [] and out == ""
    assert err == (
        f"autotune: error: --host {host}: not a loopback address, and optuna-dashboard's API "
        f"deletes and renames studies without authentication for anyone who reaches it; add "
        f"--expose to serve there anyway, or leave --host out (127.0.0.1)\n"
    )


def test_expose_serves_beyond_loopback_and_says_what_that_means(capsys, served, storage):
    port = free_port()
    rc, out, err = dashboard(
        capsys, "--storage", storage, "--host", "0.0.0.0", "--port", str(port), "--expose"
    )
    assert rc == 0 and served == [("0.0.0.0", port)]
    assert f"at http://0.0.0.0:{port}/dashboard/" in out
    assert "--expose" in err and "can delete and rename studies" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost"])
def test_loopback_hosts_are_served_without_a_word(capsys, served, storage, host):
    port = free_port()
    rc, out, err = dashboard(capsys, "--storage", storage, "--host", host, "--port", str(port))
    assert rc == 0 and served == [(host, port)] and err == ""


@pytest.mark.parametrize("port", ["0", "65536", "-1"])
def test_a_port_outside_1_to_65535_is_one_line_exit_2(capsys, served, storage, port):
    rc, out, err = dashboard(capsys, "--storage", storage, "--port", port)
    assert rc == 2 and served == []
    assert err == f"autotune: error: --port {port}: not a TCP port; choose one from 1 to 65535\n"


def test_a_port_in_use_is_one_line_exit_2(capsys, served, storage):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = dashboard(capsys, "--storage", storage, "--port", str(port))
    assert rc == 2 and served == []
    assert err == (
        f"autotune: error: --host 127.0.0.1 --port {port}: cannot listen there (Address "
        f"already in use); choose another --port or stop what listens there\n"
    )


def test_the_host_is_checked_before_the_storage(capsys, served, tmp_path):
    rc, _, err = dashboard(capsys, "--run-dir", str(tmp_path / "none"), "--host", "0.0.0.0")
    assert rc == 2 and "--expose" in err and served == []


# The network lab's private directory.


def test_the_lab_directory_is_made_private_whatever_the_umask(tmp_path):
    path = tmp_path / "atlab"
    assert netlab.check_state_dir(path) is False and not path.exists()
    old = os.umask(0o777)
    try:
        assert netlab.check_state_dir(path, create=True) is True
    finally:
        os.umask(old)
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()
    assert netlab.check_state_dir(path, create=True) is True  # ours already: taken as it is


def refused(path, match: str, *, create: bool = True) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        netlab.check_state_dir(path, create=create)
    message = str(e.value)
    assert "\n" not in message and str(path) in message and f"rm -r {path}" in message
    return message


def test_a_symlink_is_refused_even_to_a_private_directory(tmp_path):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    target.chmod(0o700)
    (tmp_path / "atlab").symlink_to(target)
    refused(tmp_path / "atlab", "is a symlink")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    refused(dangling, "is a symlink")
    assert not (tmp_path / "nowhere").exists()  # nothing was made through it


def test_a_regular_file_in_the_way_is_refused(tmp_path):
    path = tmp_path / "atlab"
    path.write_text("{}")
    refused(path, "is not a directory")


@pytest.mark.parametrize("mode", [0o755, 0o777, 0o1777, 0o750])
def test_a_directory_open_to_others_is_refused(tmp_path, mode):
    path = tmp_path / "atlab"
    path.mkdir()
    path.chmod(mode)
    refused(path, f"has mode {mode:04o}, not 0700")
    assert stat.S_IMODE(os.lstat(path).st_mode) == mode  # left as found


def test_another_users_directory_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "atlab"
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    owner = os.lstat(path).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    refused(path, f"belongs to uid {owner}, not to you \\(uid {owner + 1}\\)")


def test_the_lab_record_is_read_only_from_the_private_directory(tmp_path, monkeypatch):
    path = tmp_path / "atlab"
    monkeypatch.setattr(netlab, "TEMP_DIR", path)
    monkeypatch.setattr(netlab, "RECORD", path / "lab.json")
    assert netlab.current() is None  # no directory: no lab
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    (path / "lab.json").write_text('{"nodes": 2, "rate": "1gbit", "cpus_per_node": 1}')
    refused(path, "has mode 0777", create=False)
    with pytest.raises(ConfigError, match="not the lab's private directory"):
        netlab.current()
    path.chmod(0o700)
    assert netlab.current() == netlab.Lab(nodes=2, rate="1gbit", cpus_per_node=1)


def test_rays_world_writable_temp_dir_is_inside_the_private_one():
    assert netlab.RAY_TEMP_DIR.parent == netlab.TEMP_DIR
    assert netlab.RECORD.parent == netlab.TEMP_DIR


def test_h_l01_a_failed_lab_step_shows_the_line_that_says_what_failed():
    """H-L01: ``ray start`` prints its error on stderr and a harmless "Local node IP" line last
    on stdout; the one-line error took the stdout line."""
    from autotune.netlab import failure_line

    stderr = (
        "2026-11-27 10:45:49,882 INFO scripts.py:1043 -- Local node IP: 10.213.0.1\n"
        "RuntimeError: Token authentication is enabled but no authentication token was found\n"
        "  (set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)\n"
    )
    stdout = "Local node IP: 10.213.0.1\n"
    assert failure_line(stderr, stdout).startswith("RuntimeError: Token authentication")
    assert failure_line("", stdout) == "Local node IP: 10.213.0.1"  # nothing better said
    assert failure_line("", "") == ""
