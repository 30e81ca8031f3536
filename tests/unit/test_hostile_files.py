"""Profiles, study definitions and search spaces may come from someone else: what a file can
make autotune do is bounded. Each case is a row of docs/security.md (H-Y..)."""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import pytest
import yaml

from autotune.core import safe_yaml
from autotune.core.errors import ConfigError
from autotune.launch.hardware import differences
from autotune.profile.profile import Profile
from tests.conftest import in_process
from tests.unit.test_profile_env import write

#: 856 bytes that parse to nine levels of nine-fold aliases: 9**9 strings written out.
ALIAS_BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
)


def profile_with(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def refused(path: Path, message: str) -> str:
    with pytest.raises(ConfigError, match=message) as e:
        Profile.load(path)
    line = str(e.value)
    assert "\n" not in line and len(line) < 400, line
    return line


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path):
    """H-Y01: the 856-byte bomb became 246 MB when ``autotune launch`` printed the hardware
    differences; now refused at load, and the process does not grow by more than a few MiB."""
    assert len(ALIAS_BOMB) < 900
    path = profile_with(tmp_path, "version: 1\nhardware: {}\n" + ALIAS_BOMB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(path, "more than 100000 values once its aliases are expanded")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50 * 1024


def test_a_recursive_alias_is_refused(tmp_path):
    """H-Y02: a list that contains itself."""
    refused(profile_with(tmp_path, "version: 1\nx: &x [*x]\n"), "nested more than 32 levels")


def test_a_file_larger_than_any_profile_is_refused_unread(tmp_path):
    """H-Y03"""
    path = profile_with(tmp_path, "version: 1\n" + "#" * (2 << 20))
    refused(path, "larger than 1024 KiB")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """H-Y04: ``AUTOTUNE_PROFILE`` or ``--profile`` naming a FIFO would block a reader."""
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    t = threading.Thread(
        target=lambda: result.append(pytest.raises(ConfigError, Profile.load, fifo).value)
    )  # noqa: E501
    t.start()
    t.join(5)
    assert not t.is_alive(), "Profile.load blocked on a FIFO"
    assert "not a regular file" in str(result[0])


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom"], ids=["H-Y05", "H-Y05b"])
def test_a_device_is_refused(path):
    with pytest.raises(ConfigError, match="not a regular file"):
        Profile.load(path)


def test_a_directory_is_refused(tmp_path):
    """H-Y06"""
    with pytest.raises(ConfigError, match="cannot read profile|not a regular file"):
        Profile.load(tmp_path)


def test_deep_nesting_is_a_one_line_error_not_a_recursion_traceback(tmp_path):
    """H-Y07: PyYAML's composer recurses once per level."""
    path = profile_with(tmp_path, "version: 1\nx: " + "[" * 200_000 + "]" * 200_000 + "\n")
    refused(path, "nested more than 32 levels deep")


def test_a_python_tag_runs_nothing(tmp_path):
    """H-Y08: the safe loader knows no Python tags."""
    marker = tmp_path / "pwned"
    text = f"version: 1\nx: !!python/object/apply:os.system ['touch {marker}']\n"
    refused(profile_with(tmp_path, text), "not valid YAML")
    assert not marker.exists()


def test_bytes_that_are_not_utf8_are_refused(tmp_path):
    """H-Y09"""
    path = tmp_path / "p.yaml"
    path.write_bytes(b"version: 1\n\xff\xfe: x\n")
    refused(path, "not UTF-8 text")


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(
            lambda d: d["hardware"].update(device_name={"a": [1] * 10}),
            "hardware.device_name: must be a number, a short text or a flag",
            id="H-Y10",
        ),
        pytest.param(
            lambda d: d["hardware"].update(torch="x" * 5000),
            "hardware.torch: a text of 5000 characters; at most 1000",
            id="H-Y11",
        ),
        pytest.param(
            lambda d: d["measured"].update(note=list(range(5000))),
            "measured.note: 5000 items; at most 1000",
            id="H-Y12",
        ),
        pytest.param(
            lambda d: d["study"].update(name=["x"]),
            "study.name: must be a number, a short text or a flag",
            id="H-Y13",
        ),
        pytest.param(
            lambda d: d["workload"].update(options={"a": {"b": {"c": 1}}}),
            "workload.options.a.b: must be a number",
            id="H-Y14",
        ),
    ],
)
def test_descriptive_sections_hold_short_values(tmp_path, edit, message):
    refused(write(tmp_path / "p.yaml", edit), message)


def test_a_hardware_difference_line_is_short_whatever_the_profile_holds():
    """H-Y15: what ``autotune launch`` prints of a profile's hardware stays a short line."""
    lines = differences(
        {"device_name": "x" * 1000, "torch": {"a": 1}}, {"device_name": "cpu", "torch": "2.13"}
    )
    assert len(lines) == 2 and all(len(line) < 200 for line in lines), lines


@pytest.mark.parametrize("flag", ["--study", "--space"], ids=["H-Y16", "H-Y17"])
def test_a_study_definition_or_space_file_is_bounded_alike(tmp_path, flag):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB + "\n")
    out = in_process("run", flag, str(path), "--budget", "1m", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "more than 100000 values once its aliases are expanded" in out.stderr
    assert out.stderr.count("\n") == 1


def test_autotune_profile_naming_a_device_is_a_one_line_error(tmp_path, monkeypatch):
    """H-Y18: ``Profile.load()`` without a path reads ``AUTOTUNE_PROFILE``."""
    monkeypatch.setenv("AUTOTUNE_PROFILE", "/dev/zero")
    with pytest.raises(ConfigError, match="profile /dev/zero: not a regular file"):
        Profile.load()


def test_what_autotune_writes_has_no_aliases():
    """A shared value is written twice, so a file autotune wrote never needs an alias."""
    shared = [1.0, 2.0]
    text = safe_yaml.dump({"a": shared, "b": shared})
    assert "&" not in text and "*" not in text
    assert yaml.safe_load(text) == {"a": shared, "b": shared}


def test_a_profile_beyond_this_machine_is_warned_about_not_refused(tmp_path):
    """H-Y19: 200 workers and 512 threads per rank are within the bounds (a node may have
    that many CPUs) but not on a 2-CPU machine: loaded, with a warning line for each."""
    path = write(
        tmp_path / "p.yaml",
        lambda d: (d["data"].update(num_workers=200), d["env"].update(OMP_NUM_THREADS="512")),
    )
    p = Profile.load(path)
    assert p.machine_warnings(cpus=2) == [
        "data.num_workers 200 per rank, on 2 CPU(s)",
        "env.OMP_NUM_THREADS 512 per rank, on 2 CPU(s)",
    ]
    assert p.machine_warnings(cpus=1024) == []


def test_h_y20_a_5000_digit_integer_is_one_line_not_a_traceback(tmp_path):
    """H-Y20."""
    path = tmp_path / "huge.yaml"
    path.write_text(f"version: {'9' * 5000}\n")
    with pytest.raises(ConfigError, match="a number too long to be any setting's") as e:
        Profile.load(path)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_h_p70_a_profile_without_a_ddp_setting_gets_pytorchs_and_exports(tmp_path):
    """H-P70: a profile without ``ddp.bucket_cap_mb`` loaded, then ``export --format`` failed
    with a KeyError traceback; the setting is now PyTorch's default, in every consumer."""
    from autotune import adapters
    from tests.unit.test_profile_env import write

    path = write(tmp_path / "p.yaml", lambda d: d["ddp"].pop("bucket_cap_mb"))
    p = Profile.load(path)
    assert p.ddp_kwargs["bucket_cap_mb"] == 25.0
    for fmt in sorted(adapters.FORMATS):
        compile(adapters.render(p, fmt), fmt, "exec")


def test_h_p71_a_powersgd_hook_without_its_rank_is_refused_at_load(tmp_path):
    """H-P71."""
    from tests.unit.test_profile_env import write

    path = write(tmp_path / "p.yaml", lambda d: d["ddp"].update(comm_hook={"name": "powersgd"}))
    with pytest.raises(ConfigError, match="matrix_approximation_rank"):
        Profile.load(path)
