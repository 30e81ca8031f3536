"""glibc's malloc pinned (``autotune.core.allocator``) in rank processes, in script-mode trials and
in
a job that applies a profile: the cause of the cold first baseline was page faults from glibc's
dynamic thresholds (docs/measurement.md). Each check runs in a child process, so the test
process keeps its own allocator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.core import allocator
from autotune.core.config import TrialConfig
from autotune.definition.space import SearchSpace
from tests.unit.test_profile_env import CPU, profile

#: A step's worth of the default workload's large blocks: six 16 MiB tensors (a layer's weight
#: or gradient), touched, then all freed, as a training step does; the minor page faults of
#: the last of 12 such steps.
CHILD = r"""
import ctypes, json, resource, sys
pinned = None
if sys.argv[1] == "pin":  # what a rank process does when the pool starts it
    from autotune.core import allocator
    pinned = allocator.pin()
elif sys.argv[1] == "apply":  # a user's script: Profile.load() then apply_env()
    from autotune.profile.profile import Profile
    Profile.load(sys.argv[2]).apply_env()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 16 * 2**20
faults = []
for step in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(6)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks:
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"pinned": pinned, "faults": faults}))
"""


#: One step's blocks, in 4 KiB pages.
PAGES = 6 * 16 * 2**20 // 4096


def run_child(mode: str, *args: str, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def pinned() -> dict:
    """A pinned child's faults; skips where the C library is not glibc (nothing to pin)."""
    child = run_child("pin")
    if not child["pinned"]:
        pytest.skip("the C library is not glibc: nothing to pin")
    return child


def test_a_pinned_process_stops_faulting_its_blocks_in_after_the_first_step(pinned):
    assert pinned["faults"][0] >= PAGES // 2, "the first step faults its blocks in"
    assert max(pinned["faults"][2:]) < PAGES // 20, pinned["faults"]


def test_left_dynamic_glibc_gives_the_blocks_back_and_faults_them_in_every_step(pinned):
    """What the pin is for (glibc's behaviour, not autotune's): without it, the freed blocks go
    back to the system at the end of each step and every step faults them in again."""
    dynamic = run_child("none")
    assert min(dynamic["faults"][2:]) >= PAGES // 2, dynamic["faults"]


def test_the_environment_variables_pin_a_new_process_as_mallopt_does(pinned):
    """What ``autotune launch`` and a script-mode trial hand the command: glibc reads them when
    the process starts."""
    child = run_child("none", env={**os.environ, **allocator.ENV})
    assert max(child["faults"][2:]) < PAGES // 20, child["faults"]


def test_a_profile_pins_the_process_that_applies_it(pinned, tmp_path):
    """The README's pattern, in a process already running: ``apply_env`` calls ``mallopt``."""
    config = TrialConfig.from_values(SearchSpace.load("default").resolve(CPU).defaults(), CPU)
    assert {k: config.env[k] for k in allocator.ENV} == dict(allocator.ENV)
    path = profile(config, CPU).save(tmp_path / "p.yaml")
    child = run_child("apply", str(path))
    assert max(child["faults"][2:]) < PAGES // 20, child["faults"]
