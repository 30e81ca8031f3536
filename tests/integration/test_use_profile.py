"""Applying a profile: the README's training-script example under `autotune launch` and
torchrun (2 real gloo ranks), `autotune env`, `autotune launch`, hardware warnings, and
`autotune dashboard`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from autotune.core import allocator
from autotune.core.config import TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.launch.hardware import describe
from autotune.profile.profile import Profile
from tests.conftest import REPO, autotune_cmd

pytestmark = pytest.mark.integration

CPU = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=1, bf16=True
)


def cpu_profile(path, *, hardware=None, **changes) -> Profile:
    values = {**SearchSpace.load("default").resolve(CPU).defaults(), **changes}
    here = {
        k: v
        for k, v in describe("gloo").items()
        if k in ("device", "device_name", "device_count", "torch", "nccl")
    }
    profile = Profile.from_config(
        TrialConfig.from_values(values, CPU),
        study={"name": "test", "best_trial": 3, "baseline_trial": 0},
        workload={
            "trainer": "mlp",
            "options": {},
            "world_size": 2,
            "backend": "gloo",
            "global_batch": 64,
        },
        hardware={**here, "node_count": 1, **(hardware or {})},
        measured={"baseline_samples_per_s": 1.0, "best_samples_per_s": 2.0, "speedup": 2.0},
    )
    profile.save(path)
    return profile


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Use the profile in your training script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_training_script_runs_under_launch_and_torchrun(tmp_path):
    profile = tmp_path / "best.yaml"
    cpu_profile(
        profile,
        micro_batch=16,
        comm_hook="fp16",
        bucket_cap_mb=5.0,
        precision="bf16",
        num_workers=1,
        prefetch_factor=2,
    )
    script = tmp_path / "train.py"
    script.write_text(readme_example())
    p = subprocess.run(
        autotune_cmd(
            "launch",
            str(profile),
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(script),
            str(profile),
        ),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    # 1024 samples / 2 ranks / micro-batch 16 = 32 micro-steps, 2 per optimizer step
    assert "trained 32 micro-steps of 16" in p.stdout
    assert "measured on other hardware" not in p.stderr


def test_env_prints_export_lines_that_a_shell_reads_back(tmp_path):
    path = tmp_path / "best.yaml"
    cpu_profile(path)
    profile = Profile.load(path)
    # (quoting of hostile names and values: tests/unit/test_profile_env.py; a profile's env
    # holds only the knob registry's NCCL variables, OMP_NUM_THREADS and glibc's allocator pin)
    profile.env["NCCL_ALGO"] = "Tree"
    profile.save(path)
    out = subprocess.run(
        autotune_cmd("env", str(path)), capture_output=True, text=True, check=True
    ).stdout
    assert "export OMP_NUM_THREADS=1" in out
    assert "export MALLOC_MMAP_THRESHOLD_=33554432" in out  # how every trial ran
    shown = subprocess.run(
        ["bash", "-c", out + 'printf "%s" "$NCCL_ALGO"'], capture_output=True, text=True
    ).stdout
    assert shown == "Tree"


def test_launch_applies_the_env_returns_the_exit_code_and_warns_on_other_hardware(tmp_path):
    path = tmp_path / "best.yaml"
    cpu_profile(path, hardware={"device_name": "NVIDIA H100 80GB HBM3", "torch": "2.99.0"})
    profile = Profile.load(path)
    profile.env["NCCL_ALGO"] = "Ring"
    profile.save(path)
    p = subprocess.run(
        autotune_cmd(
            "launch",
            str(path),
            "--",
            "bash",
            "-c",
            'echo "$NCCL_ALGO $MALLOC_TRIM_THRESHOLD_"; exit 7',
        ),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 7 and p.stdout.strip() == "Ring 1073741824"
    assert "measured on other hardware: device_name: 'NVIDIA H100 80GB HBM3'" in p.stderr
    assert "torch: '2.99.0'" in p.stderr
    with pytest.warns(UserWarning, match="device_name"):
        assert profile.warn_if_hardware_differs()


def test_apply_env_autocast_and_scaler_follow_the_profile(tmp_path):
    import torch

    p = cpu_profile(tmp_path / "a.yaml", precision="bf16")
    environ: dict[str, str] = {}
    assert p.apply_env(environ) == {"OMP_NUM_THREADS": "1", **allocator.ENV} == environ
    with p.autocast("cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert torch.is_autocast_enabled("cpu")
    assert not p.grad_scaler("cpu").is_enabled()
    fp32 = cpu_profile(tmp_path / "b.yaml")
    with fp32.autocast("cpu"):
        assert not torch.is_autocast_enabled("cpu")


def test_autotune_dashboard_serves_the_study(tmp_path, run_env):
    import optuna

    url = f"sqlite:///{tmp_path / 'x.db'}"
    optuna.create_study(study_name="seen-by-the-dashboard", storage=url)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        autotune_cmd("dashboard", "--storage", url, "--port", str(port)),
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line
        printed = line.split(" at ", 1)[1].split()[0]  # with the dashboard's token
        # a browser: the printed address sets the cookie the API then needs
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        names = None
        for _ in range(60):
            try:
                browser.open(printed, timeout=5).close()
                with browser.open(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    names = [s["study_name"] for s in json.load(r)["study_summaries"]]
                break
            except OSError:
                time.sleep(0.5)
        assert names == ["seen-by-the-dashboard"]
        with pytest.raises(urllib.error.HTTPError) as e:  # no token, no cookie: refused
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5)
        assert e.value.code == 403
    finally:
        server.terminate()
        server.wait(timeout=30)
