"""Script mode's pure parts: rank 0's step stamps turned into a measurement (``StepStream``),
and the checks of ``autotune run ... -- CMD`` before anything starts (``script_job``)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from autotune.core.config import MeasureSettings
from autotune.core.errors import ConfigError
from autotune.core.numerics import CURVE_STEPS
from autotune.core.stats import Interval
from autotune.core.step_report import BadReport
from autotune.definition.studydef import StudyDefinition
from autotune.script.command import Reports, StepStream, error_line, loss_curve
from autotune.script.job import node_command, script_job
from autotune.script.nodes import FOLLOWERS_WAIT_S

M = MeasureSettings(window_s=1.0, min_windows=3, max_windows=6)


def stamps(step_times: list[float]) -> list[float]:
    out = [100.0]
    for t in step_times:
        out.append(out[-1] + t)
    return out


def test_slow_first_steps_are_warm_up_and_windows_are_samples_per_second():
    times = [1.0, 0.5, 0.3] + [0.1] * 200
    s = StepStream(M, samples_per_step=64.0)
    seen = stamps(times)
    # fed as the file grows: not measured until enough windows exist
    assert not s.feed(seen[:5])
    assert s.feed(seen)
    assert s.warmup_steps is not None and s.warmup_steps >= 3  # the slow steps are not timed
    assert s.steps_per_window in (10, 11)  # ceil(window_s / the settled step time of ~0.1 s)
    assert s.windows == pytest.approx([640.0] * len(s.windows))
    assert s.stop and s.stop != "pruned" and 3 <= len(s.windows) <= 6


def test_a_trial_clearly_below_the_incumbent_is_pruned():
    s = StepStream(M, samples_per_step=64.0, incumbent=Interval(2100.0, 2000.0, 2200.0, 5))
    assert s.feed(stamps([0.1] * 200))
    assert s.stop == "pruned"


def test_a_report_line_being_written_is_not_read(tmp_path):
    f = tmp_path / "rank-0.steps"
    f.write_text("t 1.5\nl 0.25\nt 2.0\nt 2.")
    r = Reports(f)
    r.read()
    assert (r.stamps, r.losses) == ([1.5, 2.0], [0.25])
    with open(f, "a") as out:  # the line is finished, and another one written
        out.write("5\nt 3.0\n")
    r.read()
    assert (r.stamps, r.losses) == ([1.5, 2.0, 2.5, 3.0], [0.25])  # each line read once
    missing = Reports(tmp_path / "missing")
    missing.read()
    assert (missing.stamps, missing.losses) == ([], [])


def test_the_wrapped_model_reports_its_steps_and_peak_memory(tmp_path, monkeypatch):
    """What ``Profile.wrap`` installs in a trial: a stamp per forward pass, and every
    ``MEMORY_EVERY``-th the peak memory, read back by the driver's ``Reports``."""
    import resource

    import torch

    from autotune.core import step_report

    monkeypatch.setenv("AUTOTUNE_REPORT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(step_report, "_OUT", {})
    model = torch.nn.Linear(4, 2)
    assert step_report.install(model)
    for _ in range(step_report.MEMORY_EVERY + 1):
        step_report.report_loss(model(torch.ones(3, 4)).sum())
    step_report._OUT[str(tmp_path)].flush()
    r = Reports(tmp_path / "rank-0.steps")
    r.read()
    assert len(r.stamps) == len(r.losses) == step_report.MEMORY_EVERY + 1
    lines = (tmp_path / "rank-0.steps").read_text().splitlines()
    assert sum(x.startswith("m ") for x in lines) == 2  # the first forward and the 9th
    now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert 0.5 * now < r.peak_mb <= now + 1  # this process's peak resident set, in MiB


def test_a_script_reporting_one_loss_per_micro_step_gives_one_value_per_optimizer_step():
    losses = [float(k) for k in range(40)]
    # 4 micro-steps per optimizer step, one loss each: means of 4
    assert loss_curve(losses, 40, 4)[:3] == [1.5, 5.5, 9.5] and len(loss_curve(losses, 40, 4)) == 10
    # one loss per optimizer step (10 of 40 forwards): read as it is, at most CURVE_STEPS
    assert loss_curve(losses[:10], 40, 4) == losses[:10]
    assert loss_curve(losses, 40, 1) == losses[:CURVE_STEPS]
    assert loss_curve([], 40, 4) == []


def definition(cmd: list[str], **settings) -> StudyDefinition:
    d = StudyDefinition.load("default").override(**settings)
    return dataclasses.replace(d, command=tuple(cmd))


def test_the_world_size_comes_from_torchrun_and_script_mode_has_no_limit_probe():
    d, job = script_job(
        definition(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node=4",
                "train.py",
                "--lr",
                "3e-4",
            ],
            global_batch=128,
        )
    )
    assert (job.world_size, job.global_batch, job.name) == (4, 128, "script-train")
    assert d.world_size == 4 and d.limit is True and d.concurrent_trials == 1  # the user's
    assert d.placement == "strict_pack"  # the command runs on the placement group's one node


@pytest.mark.parametrize(
    ("cmd", "settings", "says"),
    [
        (["no-such-command-xyz", "train.py"], {"global_batch": 64}, "no such command"),
        ([sys.executable, "train.py"], {}, "--global-batch"),
        (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--master-addr=10.0.0.1",
                "t.py",
            ],
            {"global_batch": 64},
            "--master-addr: on 2 nodes",
        ),
        (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--standalone",
                "t.py",
            ],
            {"global_batch": 64},
            "--standalone: on 2 nodes",
        ),
        (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--rdzv-endpoint",
                "h:1",
                "t.py",
            ],
            {"global_batch": 64},
            "--rdzv-endpoint: on 2",
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:4", "t.py"],
            {"global_batch": 64},
            "--nnodes 1:4: give a fixed number of nodes",
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "t.py"],
            {"global_batch": 64, "nodes": 3},
            "--nodes 3 disagrees with the command's --nnodes 2",
        ),
        ([sys.executable, "t.py"], {"global_batch": 64, "nodes": 2}, "2 nodes need torchrun"),
        (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "t.py",
            ],
            {"global_batch": 64, "world_size": 2},
            "disagrees with the command's 2",
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "t.py"],
            {"global_batch": 64, "placement": "pack"},
            None,
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"],
            {"global_batch": 64, "world_size": 4},
            "disagrees",
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "t.py"],
            {"global_batch": 64},
            "not divisible",
        ),
        ([sys.executable, "t.py"], {"global_batch": 64, "concurrent_trials": 2}, "one trial"),
        (
            [sys.executable, "t.py"],
            {"global_batch": 64, "placement": "spread"},
            "--placement spread: script mode places one bundle per node, strict_pack on 1",
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "t.py"],
            {"global_batch": 64, "placement": "strict_pack"},
            "strict_spread on 2 node",
        ),
        (
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "t.py"],
            {"global_batch": 64, "world_size": 8},
            "--world-size 8: torchrun starts one rank per node without --nproc-per-node",
        ),
    ],
)
def test_script_mode_refuses_what_it_cannot_run_with_the_fix(cmd, settings, says):
    if says is None:  # the default placement: no error
        script_job(definition(cmd, **settings))
        return
    with pytest.raises(ConfigError, match=says):
        script_job(definition(cmd, **settings))


@pytest.mark.parametrize(
    ("cmd", "settings", "nodes", "world"),
    [
        (["torchrun", "--nnodes", "2", "--nproc-per-node", "3", "t.py"], {}, 2, 6),
        (["torchrun", "--nnodes=3:3", "t.py"], {}, 3, 3),
        (["torchrun", "--nproc_per_node", "2", "t.py"], {"nodes": 2}, 2, 4),
        (["torchrun", "--nproc-per-node", "2", "-m", "pkg.train", "--nnodes", "9"], {}, 1, 2),
        (["torchrun", "--nnodes", "2", "t.py", "--nnodes", "7"], {}, 2, 2),  # the script's own
        (
            [sys.executable, "-m", "torch.distributed.run", "t.py"],
            {"nodes": 2, "world_size": 2},  # torchrun's one rank per node
            2,
            2,
        ),
    ],
)
def test_nodes_and_world_size_come_from_torchrun_or_nodes(cmd, settings, nodes, world):
    which = str(Path(sys.executable).with_name("torchrun"))  # the installed one, PATH or not
    cmd = [which if w == "torchrun" else w for w in cmd]
    d, job = script_job(definition(cmd, global_batch=12, **settings))
    assert (job.nodes, job.world_size, d.nodes, d.world_size) == (nodes, world, nodes, world)
    assert d.placement == ("strict_spread" if nodes > 1 else "strict_pack")


def test_each_node_runs_torchrun_with_its_rank_and_the_first_nodes_rendezvous():
    cmd = ("/venv/bin/torchrun", "--nproc-per-node", "2", "train.py", "--node-rank", "9")
    assert node_command(cmd, nodes=1, node_rank=0, addr="a", port=1) == list(cmd)  # as typed
    assert node_command(cmd, nodes=2, node_rank=1, addr="10.0.0.1", port=29400) == [
        "/venv/bin/torchrun",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=29400",
        "--nproc-per-node",
        "2",
        "train.py",
        "--node-rank",
        "9",
    ]
    module = ("python3", "-u", "-m", "torch.distributed.run", "--nnodes", "2", "t.py")
    assert node_command(module, nodes=2, node_rank=0, addr="h", port=5) == [
        "python3",
        "-u",
        "-m",
        "torch.distributed.run",
        "--node-rank=0",
        "--master-addr=h",
        "--master-port=5",
        "--nnodes",
        "2",
        "t.py",
    ]
    with pytest.raises(ValueError, match="not torchrun"):
        node_command(("python3", "t.py"), nodes=2, node_rank=0, addr="h", port=5)


# --- hostile step reports: each bad line fails the trial in one line naming it -------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param(
            "t 5.0\nt 5.0\n",
            "line 2: time stamp 5.0 is not after the one before",
            id="H-S10-equal-stamps",
        ),
        pytest.param(
            "t 5.0\nl 0.1\nt 4.0\n",
            "line 3: time stamp 4.0 is not after",
            id="H-S10-backwards-stamps",
        ),
        pytest.param(
            "t 5.0\nt 5.00000000001\n",
            "line 2: time stamp 5.00000000001 is not after",
            id="H-S10-stamps-closer-than-a-step",
        ),
        pytest.param(
            "t nan\n", "line 1: time stamp nan is not a number of seconds", id="H-S11-nan-stamp"
        ),
        pytest.param("t 1.0\nt inf\n", "line 2: time stamp inf", id="H-S11-infinite-stamp"),
        pytest.param("t -3.0\n", "time stamp -3.0 is not", id="H-S11-negative-stamp"),
        pytest.param("t 1.0\nt 1e300\n", "time stamp 1e+300 is not", id="H-S11-huge-stamp"),
        pytest.param(
            "t 1.0\nstep 2\n", "line 2: 'step 2' is not 't|l|m NUMBER'", id="H-S12-unknown-line"
        ),
        pytest.param("t 1.0\nt one\n", "line 2: 't one' is not", id="H-S12-not-a-number"),
        pytest.param("t 1.0\n\n", "line 2: '' is not", id="H-S12-blank-line"),
        pytest.param(
            "l " + "1" * 100 + "\n", "line 1: a line longer than 64 bytes", id="H-S12-long-line"
        ),
        pytest.param(
            "t 1.0\n" + "7" * 5000, "line 2: a line longer than 64 bytes", id="H-S12-endless-line"
        ),
        pytest.param("m nan\n", "line 1: peak memory nan MiB is not", id="H-S13-nan-memory"),
        pytest.param("m -5\n", "peak memory -5.0 MiB is not", id="H-S13-negative-memory"),
        pytest.param("m inf\n", "peak memory inf MiB is not", id="H-S13-infinite-memory"),
    ],
)
def test_a_bad_step_report_line_is_refused_naming_the_file_and_the_line(tmp_path, text, says):
    f = tmp_path / "rank-0.steps"
    f.write_text(text)
    with pytest.raises(BadReport) as e:
        Reports(f).read()
    assert str(e.value).startswith("step report rank-0.steps line ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_a_report_is_read_a_bounded_chunk_at_a_time_and_its_lines_are_counted(
    tmp_path, monkeypatch
):
    """H-S14: a report of endless lines: each read takes at most ``READ_BYTES``; past
    ``MAX_LINES`` lines the report is refused."""
    from autotune.core import step_report as report

    f = tmp_path / "rank-0.steps"
    f.write_text("".join(f"t {100 + k / 10}\n" for k in range(50)))
    monkeypatch.setattr(report, "READ_BYTES", 64)
    r = Reports(f)
    assert r.read() and 0 < len(r.stamps) < 50  # more to read at once
    while r.read():
        pass
    assert len(r.stamps) == 50
    monkeypatch.setattr(report, "MAX_LINES", 20)
    r = Reports(f)
    with pytest.raises(BadReport, match="line 21: more than 20 lines"):
        while r.read():
            pass


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_report_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    """H-S14: a script that makes its report a FIFO (an open for reading would wait for a
    writer for ever) or a directory."""
    f = tmp_path / "rank-0.steps"
    os.mkfifo(f) if kind == "fifo" else f.mkdir()
    with pytest.raises(BadReport, match="step report rank-0.steps is not a regular file"):
        Reports(f).read()


def test_losses_of_both_infinities_or_too_large_to_add_make_a_nan_loss_not_an_error():
    """H-S15: ``statistics.fmean`` raises on +inf and -inf together, and on finite values
    whose sum overflows; the loss curve and the loss are then NaN or infinite, which fails
    the trial as ``nan``."""
    import math

    assert all(math.isnan(x) for x in loss_curve([math.inf, -math.inf] * 8, 16, 2))
    assert loss_curve([1e308] * 8, 8, 2) == [math.inf] * 4


def test_a_reaped_guard_is_not_signalled(monkeypatch):
    """H-S16: once ``poll`` has reaped the guard's front, its pid may be another process's
    (PIDs are reused quickly): ending the trial signals nothing by that pid."""
    import subprocess

    from autotune.script import command as trial

    proc = subprocess.Popen(["true"])
    while proc.poll() is None:  # reaped, as the watch loop's poll reaps it
        pass
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append((-pid, sig)))
    trial._end(proc)
    assert sent == []


def test_the_guard_front_tells_a_reaped_keeper_nothing(monkeypatch):
    """H-S17: the front passes SIGTERM on to its keeper through a pidfd taken while the keeper
    could not have been reaped: once it is, the signal goes nowhere (never by pid)."""
    from autotune.script import guard

    child = os.fork()
    if child == 0:
        os._exit(0)
    pidfd = os.pidfd_open(child)
    os.waitpid(child, 0)  # reaped: the number is free for any new process
    sent: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(pid))
    try:
        assert guard._tell(pidfd, child) is True
    finally:
        os.close(pidfd)
    assert sent == []


def test_the_cgroup2_mount_and_the_group_are_found_in_mountinfo():
    from autotune.script import cgroup

    hybrid = [
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
    ]
    pure = ["30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"]
    bound = ["30 23 0:26 /user.slice /mnt/my\\040cg rw - cgroup2 cgroup2 rw"]
    exists = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup/a.slice/b.scope", "/mnt/my cg/x"}

    def where(own: str, mounts: list[str]) -> str | None:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(cgroup.Path, "exists", lambda p: str(p.parent) in exists)
            found = cgroup.group_dir(own, mounts)
        return None if found is None else str(found)

    assert where("/", hybrid) == "/sys/fs/cgroup/unified"
    assert where("/a.slice/b.scope", pure) == "/sys/fs/cgroup/a.slice/b.scope"
    assert where("/user.slice/x", bound) == "/mnt/my cg/x"
    assert where("/other.slice/x", bound) is None  # outside the mount's root
    assert where("/", hybrid[1:]) is None  # cgroup v1 only


@pytest.mark.parametrize(
    "argv",
    [
        ["12"],
        ["12", "--"],
        ["x", "--", "cmd"],
        ["12", "cmd"],
        ["12", "--remove", "/tmp/d"],
        ["12", "--remove", "--", "c"],
        ["12", "--remove", "/tmp/d", "cmd"],
    ],
)
def test_the_guard_refuses_what_is_not_its_usage_and_starts_nothing(argv, capsys):
    from autotune.script import guard

    assert guard.main(argv) == 2
    assert capsys.readouterr().err.strip() == guard.USAGE


#: What torchrun prints when its rank exits with an argparse error (torch 2.x): the rank's own
#: lines, then the elastic agent's log line, its traceback and its failure banner.
TORCHRUN_FAILURE = """usage: train.py [-h] [--steps STEPS]
train.py: error: unrecognized arguments: --no-such-flag
E1127 10:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 2) local_rank: 0 (pid: 5) of binary: /venv/bin/python
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_10:00:00
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 5)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: E501 - a captured log line


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (TORCHRUN_FAILURE, "train.py: error: unrecognized arguments: --no-such-flag"),
        (
            '[rank1]: Traceback (most recent call last):\n[rank1]:   File "t.py", line 3\n'
            "[rank1]: RuntimeError: Connection closed by peer [10.0.0.1]:1234\n",
            "RuntimeError: Connection closed by peer [10.0.0.1]:1234",
        ),
        ("step 1\nstep 2\n", "step 2"),  # no error named: the last line of its own
        ("", ""),
    ],
)
def test_a_failed_command_is_named_by_its_ranks_own_error_not_torchruns_banner(
    tmp_path, text, says
):
    log = tmp_path / "script.log"
    log.write_text(text)
    assert error_line(log) == says


def test_a_scripts_windows_hopelessly_below_the_incumbent_end_the_trial_settled_or_not():
    s = StepStream(M, samples_per_step=64.0, incumbent=Interval(21000.0, 20000.0, 22000.0, 5))
    slow = [1.0] * 20  # 64 samples/s: 312x below the incumbent's low bound
    # 2 discarded steps, then windows of min_steps (2) steps: judged once two have ended
    assert not s.feed(stamps(slow[:5]))
    assert s.feed(stamps(slow[:6]))
    assert (s.stop, s.steps_per_window, s.warmup_steps) == ("hopeless", 2, 2)
    assert s.windows == pytest.approx([64.0] * 2) and s.seconds == pytest.approx([2.0] * 2)
    # the same steps against an incumbent within 4x: the prune rule's to judge
    below = StepStream(M, samples_per_step=64.0, incumbent=Interval(220.0, 200.0, 240.0, 5))
    assert below.feed(stamps(slow[:6])) and below.stop == "pruned"
    near = StepStream(M, samples_per_step=64.0, incumbent=Interval(70.0, 60.0, 80.0, 5))
    assert not near.feed(stamps(slow[:6]))


def test_a_scripts_slow_first_window_is_warm_up_and_the_next_ones_are_sized_from_it():
    # the second step says 0.5 s: a first window of 2 steps, still slow (0.375 + 0.125 s),
    # its steps a quarter off the size's: the next one sized from it (4 steps of 0.125 s),
    # again (8 steps), and the kept windows all of one size
    s = StepStream(M, samples_per_step=64.0)
    assert s.feed(stamps([1.0, 0.5, 0.375] + [0.125] * 80))
    assert s.sizes[:3] == [2, 4, 8]
    assert s.timed[0] == pytest.approx(256.0)
    assert s.warmup_steps == 2 + 2 + 4 and s.counted_steps == 8 * len(s.windows)
    assert s.windows == pytest.approx([512.0] * len(s.windows))


def test_windows_within_a_quarter_of_their_size_are_not_sized_again():
    m = MeasureSettings(window_s=1.0)
    assert m.window_steps(0.26) == 4 and m.window_steps(0.24) == 5
    assert m.resized(4, 4 * 0.24) == 4  # 5 steps where 4 ran: 25 % off, not more
    assert m.resized(4, 4 * 0.125) == 8 and m.resized(8, 8 * 0.5) == 2
    assert m.window_steps(0.0) == m.min_steps


def test_a_failed_script_is_named_from_the_end_of_its_log(tmp_path):
    """H-S09: the failure's last output line, from a log of 60 MiB (a sparse file): the driver
    reads its end, not the file (``rchar`` of ``/proc/self/io``)."""
    log = tmp_path / "script.log"
    with open(log, "wb") as f:
        f.truncate(60 << 20)
        f.seek(0, os.SEEK_END)
        f.write(b"\nthe last words\n")
    io = Path("/proc/self/io")
    before = int(io.read_text().split("rchar:")[1].split()[0])
    assert error_line(log) == "the last words"
    assert int(io.read_text().split("rchar:")[1].split()[0]) - before < 4 << 20


@pytest.mark.parametrize(("stepped", "waited"), [(False, 0.0), (True, FOLLOWERS_WAIT_S)])
def test_a_follower_whose_ranks_never_stepped_fails_without_waiting_for_the_leader(
    tmp_path, monkeypatch, stepped, waited
):
    """A follower node's command that exits before any of its ranks reported a step (a node's
    own error at start-up) cannot have been ended by the leader ending a measurement: it fails
    at once. One whose ranks stepped gives the leader ``FOLLOWERS_WAIT_S`` first (its own end
    of the command makes this node's ranks lose their peers). Ray's wait stands in for the
    leader's task, which never ends here."""
    import ray

    from autotune.core.errors import TrialFailed
    from autotune.script import nodes

    reports = tmp_path / "report"
    reports.mkdir()
    (reports / "rank-1.steps").write_text("t 1.0\n" if stepped else "")
    log = tmp_path / "node-1.log"
    log.write_text("train.py: error: no data on this node\n")
    run = dataclasses.make_dataclass("Run", ["reports", "log"])(reports, log)
    run.exited = lambda: 1
    waits = []

    def leader_running(refs, timeout, **kw):  # ray.wait on a leader that never ends
        waits.append(timeout)
        return [], refs

    monkeypatch.setattr(ray, "wait", leader_running)
    with pytest.raises(TrialFailed) as e:
        nodes._follow(run, object(), 1, timeout_s=60)
    assert "node 1: the command exited with status 1: train.py: error: no data" in str(e.value)
    assert waits == [nodes.FOLLOW_POLL_S, waited]
    assert nodes.reported(reports) is stepped
