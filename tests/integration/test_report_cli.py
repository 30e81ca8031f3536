"""From a finished run to its report, and what `autotune run` shows while it runs: the real
command on a real study (real Ray, real 2-rank gloo trials), on a pseudo-terminal for the live
display."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
import time

import matplotlib.image
import optuna
import pytest
from optuna.trial import TrialState

from autotune.definition.durations import parse_duration
from tests.conftest import autotune_cmd
from tests.integration.conftest import STUDY, autotune

pytestmark = pytest.mark.integration

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def test_report_of_a_finished_run_writes_the_page_and_pngs(finished_run):
    p = autotune(finished_run["env"], "report")  # the storage holds one study: that one
    out = finished_run["home"] / "reports" / STUDY
    paths = [line for line in p.stdout.splitlines() if line.strip()]
    assert paths[0] == str(out / "report.html")
    # importances need two COMPLETE trials that differ; in a short run most trials are pruned
    for name in ("history", "speedup", "by_parameter", "timeline"):
        png = out / f"{name}.png"
        assert str(png) in paths
        h, w, _ = matplotlib.image.imread(png).shape
        assert h > 200 and w > 300
    study = optuna.load_study(study_name=STUDY, storage=finished_run["url"])
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    page = (out / "report.html").read_text()
    assert f"autotune report: {STUDY}" in page
    assert f"of {len(complete)} COMPLETE trials" in page
    assert f"(trial {study.best_trial.number}," in page
    assert "micro_batch" in page  # the exported profile's batch section


def test_report_of_an_unknown_study_is_one_line_and_writes_nothing(finished_run, tmp_path):
    out = tmp_path / "r"
    p = autotune(finished_run["env"], "report", "--study-name", "nope", "-o", str(out), rc=2)
    assert p.stderr.startswith("autotune: error: --study-name nope: no such study")
    assert p.stderr.count("\n") == 1 and f"it has {STUDY}" in p.stderr
    assert not out.exists()
    # --study, its old spelling here (deprecated for a release): the same, said in one line
    p = autotune(finished_run["env"], "report", "--study", "nope", "-o", str(out), rc=2)
    assert p.stderr.splitlines() == [
        "autotune: deprecated: --study is now --study-name; the old spelling goes in the next "
        "release",
        f"autotune: error: --study-name nope: no such study in {finished_run['url']}; it has "
        f"{STUDY}",
    ]
    assert not out.exists()


def test_dashboard_prints_the_address_of_the_study_page(finished_run):
    from tests.integration.test_run_cli import free_port

    port = free_port()
    server = subprocess.Popen(
        autotune_cmd("dashboard", "--study-name", STUDY, "--port", str(port)),
        env=finished_run["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = server.stdout.readline()
    finally:
        server.terminate()
        server.wait(timeout=30)
    storage = optuna.storages.get_storage(finished_run["url"])
    study_id = storage.get_study_id_from_name(STUDY)
    assert f"at http://127.0.0.1:{port}/dashboard/studies/{study_id}?token=" in line


def run_on_a_terminal(cmd, env, timeout=300) -> str:
    """Run ``cmd`` with a 120-column pseudo-terminal as stdin/stdout/stderr; all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    p = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=30)
    os.close(master)
    assert p.returncode == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def test_a_terminal_gets_the_live_display_and_a_summary_table(ray_address, run_env):
    env = {**run_env, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    # the run ends after five trials (no re-validation); the budget, far above what they take,
    # is not what ends it even on a loaded machine (at 40 s, one CI run ended after the baseline)
    raw = run_on_a_terminal(
        autotune_cmd(
            "run",
            "--study",
            "quick",
            "--budget",
            "3m",
            "--n-trials",
            "5",
            "--validate-top",
            "0",
            "--address",
            ray_address,
        ),
        env,
    )
    frames = ANSI.sub("", raw).replace("\r", "\n")
    # the budget bar redrawn as it fills, the counts as trials end, the trial that runs
    bar = re.findall(r"budget .*━.* (\w+) of 3m", frames)
    spent = {0.0 if s == "0s" else parse_duration(s) for s in bar}
    assert len(spent) >= 3 and max(spent) >= 10
    counts = {
        sum(map(int, m))  # trials ended so far, whatever their state
        for m in re.findall(r"trials (\d+) complete · (\d+) failed · (\d+) pruned", frames)
    }
    assert {0, 1} <= counts  # redrawn as trials end
    assert "running baseline: defaults" in frames
    assert re.search(r"running trial 1: \S+=", frames)
    assert re.search(r"best \d+\.\d\dx \(trial \d+\)", frames)
    # the log lines stay, the live part is gone at the end, then the summary table
    assert re.search(r"baseline +[\d.,]+ samples/s +1\.00x", frames)
    tail = frames[frames.rindex("Best of") :]
    assert "0 (baseline)" in tail and "budget" not in tail
    assert "\x1b[" in raw  # a terminal gets colour


def test_a_log_file_gets_plain_lines_without_the_live_display(finished_run):
    out = finished_run["stdout"]  # captured through a pipe, as a log file would be
    assert "\x1b[" not in out and "budget ━" not in out and "running trial" not in out
    # the baseline, trials and the runs of the defaults that re-anchor speedups (anchor N)
    trial_lines = re.findall(r"^\[[\dms]+\] +(?:baseline|trial \d+|anchor \d+) ", out, re.M)
    numbers = [0 if "baseline" in t else int(t.split()[-1]) for t in trial_lines]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 3  # one line per trial
    assert "Best of" in out and "Report     autotune report --study-name" in out
