"""Logs stay bounded and are read from their end (``autotune.core.logfile``): the cap's rule
on a file, on a real process writing past it, on a rank's output (``rank.env.output_to``), and
``last_line`` on a file of 100 MiB."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune.core import logfile
from autotune.core.logfile import Limit, cap, last_line, tail
from tests.conftest import REPO

SMALL = Limit(max_bytes=20_000, head_bytes=3_000, tail_bytes=5_000)


def numbered(n: int) -> bytes:
    return b"".join(b"line %06d\n" % k for k in range(n))


def test_a_log_over_the_cap_keeps_its_head_a_marker_and_its_tail(tmp_path):
    """H-S05: a log over the cap is cut to its head, one marker line, its tail; a second cut
    counts the bytes of both."""
    log = tmp_path / "rank-0.log"
    text = numbered(5_000)  # 60,000 bytes
    log.write_bytes(text)
    assert cap(log, SMALL) == len(text) - 8_000
    cut = log.read_bytes()
    marker = f"\n[autotune: {len(text) - 8_000} bytes cut here]\n".encode()
    assert cut == text[:3_000] + marker + text[-5_000:]
    with open(log, "ab") as f:  # the writer goes on
        f.write(text)
    assert cap(log, SMALL) > 0
    again = log.read_bytes()
    assert again.startswith(text[:3_000]) and again.endswith(text[-5_000:])
    assert f"[autotune: {2 * len(text) - 8_000} bytes cut here]".encode() in again
    assert len(again) < 8_000 + 100
    assert cap(log, SMALL) == 0 and log.read_bytes() == again  # under the cap: left alone


def test_the_cap_leaves_links_and_missing_files_alone(tmp_path):
    """H-S06: a script that replaces its log with a link to another (large) file: the cap does
    not follow it."""
    other = tmp_path / "other"
    other.write_bytes(numbered(5_000))
    link = tmp_path / "script.log"
    link.symlink_to(other)
    assert cap(link, SMALL) == 0 and other.read_bytes() == numbered(5_000)
    assert cap(tmp_path / "missing", SMALL) == 0
    with pytest.raises(ValueError, match="max_bytes"):
        Limit(max_bytes=1000, head_bytes=800, tail_bytes=800)


WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"FIRST LINE\\n")
block = b"".join(b"%09d\\n" % k for k in range(6500))  # 65,000 bytes
for k in range(400):  # 26 MB, paced to last about a second
    os.write(fd, block)
    time.sleep(0.002)
os.write(fd, b"LAST LINE\\n")
"""


def test_a_process_writing_fast_past_the_cap_leaves_a_capped_log(tmp_path):
    """H-S07: a process that writes fast (26 MB in about a second): checked while it writes
    and once after, its log keeps its head and its tail and is no bigger than the cap."""
    log = tmp_path / "script.log"
    lim = Limit(max_bytes=1 << 20, head_bytes=64 << 10, tail_bytes=64 << 10)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)])
    cut = 0
    while writer.poll() is None:
        cut += cap(log, lim)
        time.sleep(0.02)
    assert cut > 0  # cut while it wrote
    cut += cap(log, lim)
    data = log.read_bytes()
    assert cut > 20 * lim.max_bytes  # it wrote far past the cap
    assert len(data) <= lim.max_bytes  # the last check found it under the cap, or cut it
    assert data.startswith(b"FIRST LINE\n") and data.endswith(b"LAST LINE\n")
    assert b" bytes cut here]\n" in data


FLOOD = """
import sys
out = sys.stdout.buffer
out.write(b"FIRST LINE\\n")
block = b"".join(b"%09d\\n" % k for k in range(6500))
for k in range(400):  # 26 MB, then the line a failure is named by, at once before the exit
    out.write(block)
out.write(b"out of data: shard 3 is empty\\n")
sys.exit(3)
"""


def piped(tmp_path: Path, code: str, lim: Limit) -> tuple[logfile.Pump, subprocess.Popen, Path]:
    log = tmp_path / "script.log"
    with open(log, "ab") as out:  # closed at once: the pump writes through its own descriptor
        pump = logfile.Pump(out, log, lim)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=pump.write_fd)
    pump.started()
    return pump, child, log


def test_a_piped_log_is_capped_and_loses_no_byte_to_a_cut(tmp_path):
    """The one writer of a script's log (``Pump``) cuts between its own writes: the log keeps
    its head and its tail, is no bigger than the cap, and the bytes kept plus the bytes the
    marker says were cut are every byte the command wrote - its last line too, which a cut
    made beside the writer can lose (the cap's race, module doc)."""
    lim = Limit(max_bytes=1 << 20, head_bytes=64 << 10, tail_bytes=64 << 10)
    pump, child, log = piped(tmp_path, FLOOD, lim)
    assert child.wait(60) == 3
    assert pump.drain(10)
    data = log.read_bytes()
    written = len(b"FIRST LINE\n") + 400 * 6500 * 10 + len(b"out of data: shard 3 is empty\n")
    marker = re.search(rb"\n\[autotune: (\d+) bytes cut here\]\n", data)
    assert len(data) <= lim.max_bytes and marker
    assert len(data) - len(marker.group(0)) + int(marker.group(1)) == written
    assert data.startswith(b"FIRST LINE\n000000000\n")
    assert data.endswith(b"000006499\nout of data: shard 3 is empty\n")
    assert last_line(log) == "out of data: shard 3 is empty"


def test_drain_waits_only_so_long_for_a_process_left_holding_the_pipe(tmp_path):
    """A process the command left behind keeps the pipe open: ``drain`` gives up after its
    timeout (saying so), and returns once that process is gone, with what it printed."""
    lim = Limit(max_bytes=1 << 20, head_bytes=64 << 10, tail_bytes=64 << 10)
    code = (
        "import subprocess, sys; print('parent', flush=True); "
        "subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(1.5); print(\"left behind\", flush=True)'])"
    )
    pump, child, log = piped(tmp_path, code, lim)
    assert child.wait(30) == 0
    assert not pump.drain(0.2)
    assert pump.drain(30)
    assert log.read_bytes() == b"parent\nleft behind\n"


RANK = """
import os, sys, time
from autotune.core import logfile
from autotune.rank.env import output_to
logfile.LIMIT = logfile.Limit(max_bytes=1 << 20, head_bytes=64 << 10, tail_bytes=64 << 10)
block = "".join("%09d\\n" % k for k in range(6500))
with output_to(sys.argv[1], 0):
    print("FIRST LINE", flush=True)
    for k in range(400):  # 26 MB
        sys.stdout.write(block)
        time.sleep(0.002)
    sys.stdout.flush()
    time.sleep(1.5)  # the cap's thread checks once a second
    sys.stderr.write("while running: %d\\n" % os.path.getsize(sys.argv[1] + "/rank-0.log"))
    print("LAST LINE", flush=True)
"""


def test_a_rank_printing_without_end_has_its_log_capped_while_it_runs(tmp_path):
    """H-S08: a rank's training code that prints without end: ``output_to``'s thread cuts
    its log while the trial runs, and once more when it ends."""
    subprocess.run([sys.executable, "-c", RANK, str(tmp_path)], cwd=REPO, check=True, timeout=60)
    data = (tmp_path / "rank-0.log").read_bytes()
    running = int(data.split(b"while running: ")[1].split()[0])
    assert running <= (1 << 20)  # capped while it ran
    assert len(data) <= (1 << 20) and b" bytes cut here]\n" in data
    assert data.startswith(b"FIRST LINE\n") and data.endswith(b"LAST LINE\n")


def read_chars() -> int:
    """Bytes this process has read through read calls, from ``/proc/self/io``."""
    io = Path("/proc/self/io").read_text()
    return int(io.split("rchar:")[1].split()[0])


def test_the_last_line_of_a_100_mib_log_is_read_from_its_end(tmp_path):
    """H-S09: the last line of a huge log (a sparse file of 100 MiB here) costs a bounded
    read, not the file."""
    log = tmp_path / "script.log"
    with open(log, "wb") as f:
        f.truncate(100 << 20)
        f.seek(0, os.SEEK_END)
        f.write(b"\nout of data: shard 3 is empty\nautotune guard: a line of its own\n\n")
    before = read_chars()
    said = last_line(log, ignore=("autotune guard:",))
    read = read_chars() - before
    assert said == "out of data: shard 3 is empty"
    assert read < 4 * logfile.TAIL_READ  # the file is 1600 times that
    assert tail(log, 10) == b" its own\n\n" and tail(tmp_path / "missing", 10) == b""
    assert last_line(tmp_path / "missing") == ""


def test_the_cap_thread_stops_with_its_log(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"x\n")
    before = threading.active_count()
    capper = logfile.Capper(log, every_s=0.01)
    time.sleep(0.05)
    capper.close()
    assert threading.active_count() == before
