"""What Ray's driver prints itself reaches a log file as plain text: a rank process that dies
makes the raylet send its driver a line ("A worker died or was killed ...") even with
``log_to_driver`` off, and Ray colours its prefix unless ``RAY_COLOR_PREFIX=0``. ``connect``
sets that where stdout is not a terminal (``launch.cluster._plain_ray_lines``); ``close``
unsets it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

#: A driver joining the cluster at argv[1], stdout the file argv[2]: an actor of its own dies by
#: SIGSEGV, the driver waits for the raylet's line about it, closes and says what it left.
DRIVER = """\
import os, signal, sys, time
import ray
from autotune.launch.cluster import connect

c = connect(sys.argv[1])
print("set while connected:", os.environ.get("RAY_COLOR_PREFIX"), flush=True)

@ray.remote(num_cpus=0)
class Doomed:
    def die(self):
        os.kill(os.getpid(), signal.SIGSEGV)

try:
    ray.get(Doomed.remote().die.remote())
except ray.exceptions.RayActorError:
    print("the actor died", flush=True)
deadline = time.monotonic() + 30
while "(raylet)" not in open(sys.argv[2]).read() and time.monotonic() < deadline:
    time.sleep(0.2)
c.close()
print("left after close:", os.environ.get("RAY_COLOR_PREFIX"), flush=True)
"""


def test_the_raylet_s_line_about_a_dead_worker_reaches_a_log_file_without_colour_codes(
    ray_address, tmp_path
):
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "-c", DRIVER, ray_address, str(log)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=True,
        )
    text = log.read_text()
    assert "the actor died" in text and "(raylet) A worker died" in text, text
    assert "\x1b[" not in text, text
    assert "set while connected: 0" in text and "left after close: None" in text, text
