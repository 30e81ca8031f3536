"""`autotune run` end to end: a real Ray instance, real 2-rank gloo DDP trials, a real SQLite
Optuna storage, read back by Optuna's own API and by the real optuna-dashboard."""

from __future__ import annotations

import json
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from optuna_dashboard import get_note

from autotune.core.config import MeasureSettings
from autotune.profile.profile import Profile
from tests.conftest import autotune_cmd, started_run, wait_for
from tests.integration.conftest import (
    BUDGET_S,
    STUDY,
    as_stored,
    autotune,
    reference,
    runs_of_the_defaults,
    trial_running,
)

pytestmark = pytest.mark.integration


#: How many times below the incumbent a trial's windows run when it is stopped as hopeless.
HOPELESS = MeasureSettings().hopeless_factor


def load(run):
    return optuna.load_study(study_name=STUDY, storage=run["url"])


def test_study_holds_a_complete_baseline_and_measured_trials(finished_run):
    study = load(finished_run)
    trials = study.get_trials()
    base = trials[0]
    assert base.user_attrs["baseline"] is True and base.state == TrialState.COMPLETE
    assert base.user_attrs["speedup"] == 1.0
    assert runs_of_the_defaults(trials)[0] == 0
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) >= 3
    for t in measured:
        a = t.user_attrs
        ci = a["interval"]
        assert ci["low"] <= a["throughput"] <= ci["high"] and ci["n"] == len(a["windows"])
        if t.number:  # against the run of the defaults before it (the baseline, or an anchor)
            assert a["speedup"] == as_stored(a["throughput"] / reference(trials, t))
        assert a["step_time_s"] > 0 and len(a["peak_memory_mb"]) == 2
        # where the overhead went: warm-up and set-up happen outside the timed windows
        assert a["warmup_s"] > 0 and a["init_s"] > 0
        # each is the slowest rank's, maybe not the same rank's: a rank that set up sooner
        # waits for the other in its first warm-up step, so the two maxima's sum can pass any
        # one rank's time outside the windows by that difference (seen in CI: by 0.019 s)
        assert max(a["warmup_s"], a["init_s"]) <= a["overhead_s"] + 0.05
        assert a["config"]["global_batch"] == 64  # the workload's global batch, always
        # one intermediate value per window: the dashboard's curve of the trial
        assert [t.intermediate_values[i] for i in range(len(a["windows"]))] == pytest.approx(
            a["windows"], rel=1e-3
        )
        if t.state == TrialState.COMPLETE:
            assert a["throughput"] == pytest.approx(t.value, rel=1e-6)
            assert a["stop"] in ("converged", "cap")
        else:  # pruned: clearly below the incumbent (upper bound under the incumbent's lower
            # bound), with its numbers so far; that can be decided as late as the last window.
            # Or hopeless: the median of its windows 4x or more below the incumbent's lower
            # bound (on a loaded machine, seen in CI), from the first on; its interval, over
            # as few as two windows, can reach past the best (seen in CI: 13241 over 9132).
            # The incumbent's lower bound is at most the best COMPLETE throughput.
            best = max(x.value for x in trials if x.state == TrialState.COMPLETE)
            if a["stop"] == "pruned":
                assert len(a["windows"]) <= 6 and ci["high"] < best
            else:
                assert a["stop"] == "hopeless" and 1 <= len(a["windows"]) <= 6
                assert statistics.median(a["windows"]) * HOPELESS <= best
    for t in trials:
        if t.state == TrialState.FAIL:
            assert t.user_attrs["reason"] in ("crash", "timeout", "illegal", "nan", "oom")
            assert t.user_attrs["reason_detail"]
    assert study.metric_names == ["samples_per_s"]
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE


def test_no_trial_starts_after_the_budget(finished_run):
    trials = load(finished_run).get_trials()
    first = trials[0].datetime_start
    assert all((t.datetime_start - first).total_seconds() <= BUDGET_S for t in trials)


def test_run_says_what_it_left_out_and_where_things_are(finished_run):
    out = finished_run["stdout"]
    assert "NCCL_ALGO: NCCL variables act only with the nccl backend" in out
    assert "comm_hook=bf16: torch refuses bf16_compress_hook without NCCL" in out
    assert f"Storage    {finished_run['url']}" in out
    assert "optuna-dashboard sqlite:///" in out
    # the re-validation it plans, said once the study is open (not defaults it then changes)
    assert (
        f"Re-validation: up to 3 candidates x 5 rounds against the baseline, fitted to a "
        f"third of the {BUDGET_S}s budget"
    ) in out


def test_profile_has_every_key_and_is_the_best_trial(finished_run):
    path = finished_run["home"] / "profiles" / f"{STUDY}.yaml"
    profile = Profile.load(path)
    study = load(finished_run)
    validation = study.user_attrs.get("validation")
    if validation is None:  # nothing measured above the baseline: the search's best as is
        chosen = study.best_trial
        assert profile.measured["best_samples_per_s"] == pytest.approx(chosen.value, abs=0.01)
        assert profile.measured["baseline_samples_per_s"] == pytest.approx(
            study.trials[0].value, abs=0.01
        )
        assert profile.measured["validation"] is None and profile.measured["note"]
    else:  # the winner of the interleaved re-measurement
        chosen = study.trials[validation["trials"][validation["winner"]]]
        # the profile rounds to 3 decimals
        assert profile.measured["speedup"] == pytest.approx(
            validation["speedup"]["median"], abs=5e-4
        )
        assert profile.measured["validation"]["order"] == validation["order"]
    assert profile.study["best_trial"] == chosen.number
    assert profile.workload == {
        "trainer": "mlp",
        "options": {"width": 256, "layers": 4, "global_batch": 64},
        "world_size": 2,
        "backend": "gloo",
        "global_batch": 64,
    }
    assert profile.hardware["device"] == "cpu" and profile.hardware["node_count"] == 1
    best_config = chosen.user_attrs["config"]
    assert profile.ddp_kwargs == best_config["ddp"]
    assert profile.batch["micro_batch"] == best_config["micro_batch"]


def test_the_run_says_how_far_its_profile_is_from_the_limit(finished_run):
    study = load(finished_run)
    limit = study.user_attrs["limit"]
    profile = Profile.load(finished_run["home"] / "profiles" / f"{STUDY}.yaml")
    base = limit["baseline"]
    # the defaults were probed as the baseline trial ran them; the exported configuration too
    assert base["trial"] == 0 and base["config"] == study.trials[0].user_attrs["config"]
    probed = limit.get("tuned", base)
    assert probed["config"] == profile.trial_config().to_dict()
    label = "tuned" if "tuned" in limit else "baseline"
    assert profile.measured["limit"][label]["world_size"] == 2
    assert profile.measured["limit"][label]["bounds"] == probed["bounds"]
    # what it sent: the 4 x 256 MLP's gradients (267,280 fp32 values) in DDP's own buckets
    assert probed["comm"]["wire_bytes"] == 267_280 * (
        2 if probed["comm"]["dtype"] != "float32" else 4
    )
    b = probed["bounds"]
    assert b["busbw_gbit_s"] > 0 and b["share_of_ceiling"] > 0 and b["share_of_ideal"] > 0
    # the trace of real DDP steps is kept where the record says; a traced probe whose rank
    # died (torch.profiler's results have crashed a rank as it freed them, rarely:
    # limit.probe.probe_one) was measured again without it, and the record and a line say so
    if "untraced" in probed:
        assert probed["trace"] is None, probed
        assert probed["untraced"].startswith("the traced probe failed (crash: "), probed
        assert (
            "taken again without its trace: the traced probe failed (crash: "
            in (finished_run["stdout"])
        )
    elif probed["trace"] is None:
        # the defaults' probe is the first measurement's, which takes no trace: a run of its
        # own takes it (limit.probe._trace_again), unless the budget left holds none or that
        # run failed; each says so in a line
        said = [ln for ln in finished_run["stdout"].splitlines() if "No Chrome trace of " in ln]
        assert label == "baseline" and said, probed
        assert "hold no run for it" in said[0] or "its run failed (" in said[0], said
    else:
        trace = json.loads(Path(probed["trace"]).read_text())
        assert "gloo:all_reduce" in {e.get("name") for e in trace["traceEvents"]}
    line = next(ln for ln in finished_run["stdout"].splitlines() if ln.startswith("Limit      "))
    assert "of the compute ceiling" in line and "next: " in line
    # the defaults were probed once, right after the baseline, and the end reused it
    first = study.user_attrs["first_measurement"]
    assert first["probe"]["bounds"] == base["bounds"] and first["probe"]["trial"] == 0
    # untraced (the screening waits for it): the defaults' trace is written after the windows
    # of a later run of them (the re-validation's first, or one at the end where the budget
    # holds it), or a line says why there is none
    assert first["probe"]["trace"] is None
    if base["trace"] is None:
        out = finished_run["stdout"]
        assert (
            "that took the Chrome trace failed (crash: " in out
            or "No Chrome trace of the defaults: no run of them took one, and the " in out
        ), out
    else:
        trace = json.loads(Path(base["trace"]).read_text())
        assert "gloo:all_reduce" in {e.get("name") for e in trace["traceEvents"]}
        assert Path(base["trace"]).parent == finished_run["home"] / "logs" / STUDY / "limit"
    assert len(set(first["probe"]["comm"]["fit_bytes"])) >= 2  # the alpha-beta sweep
    # taken in the baseline trial's session, after its windows: its seconds are its own
    assert ", after the baseline's windows): " in finished_run["stdout"]
    assert first["probe"]["measure_s"] == first["probe"]["wall_s"] > 0
    assert "Screening order from the first measurement:" in finished_run["stdout"]
    # why the search stopped: said, and stored
    stop = study.user_attrs["stop"]
    assert stop["kind"] in ("budget", "converged") and stop["budget_s"] > 0
    assert "Search stopped at" in finished_run["stdout"]
    # the dashboard's note leads with the same line
    assert line.removeprefix("Limit      ") in get_note(study).split("## Exported profile")[0]


def test_export_writes_the_same_profile(finished_run, tmp_path):
    out = tmp_path / "exported.yaml"
    autotune(finished_run["env"], "export", "--study-name", STUDY, "-o", str(out))
    exported = Profile.load(out)
    written = Profile.load(finished_run["home"] / "profiles" / f"{STUDY}.yaml")
    assert exported.ddp == written.ddp and exported.batch == written.batch
    assert exported.measured["speedup"] == written.measured["speedup"]
    # the storage holds one study: export finds it, as report does
    only = autotune(finished_run["env"], "export", "--output", str(tmp_path / "only.yaml"))
    assert only.stderr == "" and (tmp_path / "only.yaml").read_text() == out.read_text()


@pytest.mark.parametrize("fmt", ["lightning", "accelerate", "hf-trainer"])
def test_export_format_prints_the_frameworks_snippet_of_the_profile(finished_run, tmp_path, fmt):
    """`autotune export --format F` prints Python that compiles and carries the exported
    profile's bucket size; with -o it writes the same text to the file."""
    bucket = Profile.load(finished_run["home"] / "profiles" / f"{STUDY}.yaml").ddp["bucket_cap_mb"]
    p = autotune(finished_run["env"], "export", "--format", fmt)
    compile(p.stdout, f"<{fmt} snippet>", "exec")
    found = re.search(r"bucket_cap_mb\W+([0-9.]+)", p.stdout)
    assert found and float(found.group(1)) == float(bucket), p.stdout
    out = tmp_path / "snippet.py"
    autotune(finished_run["env"], "export", "--format", fmt, "-o", str(out))
    assert out.read_text() == p.stdout


#: What Ray logs when it turns token authentication on (or finds it off) by itself.
RAY_AUTH_WARNING = "Token authentication is"


def test_a_local_instance_says_nothing_of_rays_token_authentication(run_env, tmp_path):
    """A run that starts its own Ray instance sets its token authentication explicitly: Ray's
    warning that it turned it on by default is not printed; -o writes the profile there."""
    profile = tmp_path / "p.yaml"
    p = autotune(
        run_env,
        "run",
        "--study",
        "quick",
        "--budget",
        "2m",
        "--n-trials",
        "1",
        "--validate-top",
        "0",
        "--no-limit",
        "-o",
        str(profile),
    )
    assert RAY_AUTH_WARNING not in p.stdout + p.stderr, p.stderr
    assert "authentication" not in p.stderr.lower(), p.stderr
    assert "Re-validation: none (--validate-top 0" in p.stdout
    assert Profile.load(profile).study["baseline_trial"] == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_real_optuna_dashboard_reads_the_study(finished_run):
    port = free_port()
    exe = str(Path(sys.executable).parent / "optuna-dashboard")
    server = subprocess.Popen(
        [exe, finished_run["url"], "--host", "127.0.0.1", "--port", str(port), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        studies = None
        for _ in range(60):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    studies = json.load(r)["study_summaries"]
                break
            except OSError:
                time.sleep(0.5)
        assert studies is not None, "optuna-dashboard did not answer"
        summary = next(s for s in studies if s["study_name"] == STUDY)
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}", timeout=10
        ) as r:
            detail = json.load(r)
        assert len(detail["trials"]) == len(load(finished_run).trials)
        attrs = {a["key"] for a in detail["trials"][0]["user_attrs"]}
        assert {"throughput", "speedup", "step_time_s", "peak_memory_mb"} <= attrs
        # the study's note carries the exported profile
        # the exported profile's choice: the re-validation's winner, or the search's best
        path = finished_run["home"] / "profiles" / f"{STUDY}.yaml"
        best = Profile.load(path).study["best_trial"]
        assert "## Exported profile" in detail["note"]["body"]
        assert f"best_trial: {best}" in detail["note"]["body"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_running_again_resumes_without_a_second_baseline(finished_run):
    before = {t.number: t.value for t in load(finished_run).trials}
    # one more trial (--n-trials counts this invocation's), not a short budget: on a loaded
    # machine a 12-second budget may end before a trial does
    autotune(
        finished_run["env"],
        "run",
        "--study",
        "quick",
        "--budget",
        "5m",
        "--n-trials",
        "1",
        "--validate-top",
        "0",
        "--address",
        finished_run["address"],
    )
    after = load(finished_run).trials
    assert len(after) > len(before)
    assert {t.number: t.value for t in after if t.number in before} == before
    assert runs_of_the_defaults(after)[0] == 0


def test_resuming_with_a_different_workload_is_refused(finished_run):
    p = autotune(
        finished_run["env"],
        "run",
        "--study",
        "quick",
        "--budget",
        "10s",
        "--study-name",
        STUDY,
        "--trainer-option",
        "width=128",
        "--address",
        finished_run["address"],
        rc=2,
    )
    assert "choose another --study-name" in p.stderr and "measured workload" in p.stderr


TESTS_DIR = Path(__file__).resolve().parent.parent


def local_study(run_env, name):
    url = f"sqlite:///{Path(run_env['AUTOTUNE_HOME']) / 'autotune.db'}"
    return optuna.load_study(study_name=name, storage=url)


# A local Ray instance running a user's own trainer module and leaving nothing running:
# tests/integration/test_own_model.py (the README's example, run as written).


def test_a_baseline_that_fails_stops_the_run_with_the_reason(ray_address, run_env):
    # `ray job submit -- autotune run ...` runs the command with RAY_ADDRESS set: the run
    # joins that cluster (the session's instance here) instead of starting its own
    env = {**run_env, "RAY_ADDRESS": ray_address}
    p = autotune(
        env,
        "run",
        "--study",
        "quick",
        "--budget",
        "60s",
        "--trainer",
        "autotune_test_trainers:raising",
        cwd=TESTS_DIR,
        rc=1,
    )
    assert f"Joined the Ray cluster at {ray_address} (RAY_ADDRESS)" in p.stdout, p.stdout
    assert (
        "baseline trial (PyTorch defaults) failed: crash: rank 1: RuntimeError: boom on "
        "purpose in rank 1"
    ) in p.stderr
    trials = local_study(run_env, "quick-autotune_test_trainers.raising-gloo-2r").trials
    assert len(trials) == 1 and trials[0].state == TrialState.FAIL
    assert trials[0].user_attrs["reason"] == "crash"


def interrupted_trial_recorded(home: Path, by: str) -> None:
    """The run's study after a Ctrl-C or SIGTERM (``by``) during a trial: the baseline complete,
    the running trial recorded FAIL ``interrupted`` naming the signal, none left RUNNING, and
    the profile of the best so far (the baseline) exported."""
    trials = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{home / 'autotune.db'}").trials
    assert trials[0].state == TrialState.COMPLETE
    assert trials[-1].state == TrialState.FAIL
    assert trials[-1].user_attrs["reason"] == "interrupted"
    assert trials[-1].user_attrs["reason_detail"] == f"{by} during the trial"
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert Profile.load(home / "profiles" / f"{STUDY}.yaml").study["baseline_trial"] == 0


def test_ctrl_c_records_the_running_trial_and_exports(ray_address, run_env):
    """Ctrl-C while a trial runs its ranks: exit 130 (SIGTERM at the same moment, exit 143:
    test_sigterm_phases.py's trial phase, which checks the same record)."""
    import signal

    p = started_run(run_env, "--study", "quick", "--budget", "5m", "--address", ray_address)
    try:
        # the next trial is running its ranks (after the baseline, which printed its result)
        assert wait_for(trial_running(run_env["AUTOTUNE_HOME"], STUDY), 60)
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=120)[0]
    finally:
        p.kill()
    assert p.returncode == 130, out
    assert "Interrupted (Ctrl-C)" in out
    interrupted_trial_recorded(Path(run_env["AUTOTUNE_HOME"]), "Ctrl-C")


def test_a_failing_configuration_is_recorded_and_the_study_goes_on(ray_address, run_env, tmp_path):
    space = tmp_path / "micro.yaml"
    space.write_text(
        "ddp:\n  bucket_cap_mb: {type: float, low: 1, high: 100, log: true}\n"
        "batch:\n  micro_batch: {type: categorical, choices: [8, 16]}\n"
    )
    # A trial count, not a time budget, decides how many trials run: on a loaded machine a
    # 60-second budget held the baseline and the failure only.
    p = autotune(
        run_env,
        "run",
        "--study",
        "quick",
        "--budget",
        "10m",
        "--n-trials",
        "5",
        "--validate-top",
        "0",
        "--seed",
        "4",
        "--sampler",
        "random",
        "--no-screening",
        "--space",
        str(space),
        "--trainer",
        "autotune_test_trainers:no_accumulation",
        "--address",
        ray_address,
        cwd=TESTS_DIR,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    study_name = "quick-autotune_test_trainers.no_accumulation-gloo-2r"
    trials = local_study(run_env, study_name).trials
    # a value that failed twice is not run again: its next trial is recorded known_failing
    # without running, and is not counted (search.failing)
    dropped = [t for t in trials if t.user_attrs.get("reason") == "known_failing"]
    assert all(t.params["micro_batch"] == 8 for t in dropped)
    ran = [t for t in trials if t not in dropped]
    assert len(ran) == 5, "--n-trials 5 ends the search after five trials run, failures included"
    failed = [t for t in ran if t.state == TrialState.FAIL]
    # Random search with seed 4 proposes micro-batches of 8 (of 8 and 16) early, 16 after.
    assert failed and failed[0].number < 4
    for t in failed:
        assert t.params["micro_batch"] == 8
        assert t.user_attrs["reason"] == "crash"
        assert "this model refuses micro-batches of 8" in t.user_attrs["reason_detail"]
        assert "Traceback" not in t.user_attrs["reason_detail"]
    later = [t for t in ran if t.number > failed[0].number and t.state != TrialState.FAIL]
    assert later  # the study went on after the failure
    assert "FAIL crash: rank" in p.stdout
    assert "Search stopped at" in p.stdout and "--n-trials 5: 5 trials run" in p.stdout
    # Rank logs: the failure's are kept with the error in them, the baseline's too; a trial
    # that ran has none left.
    logs = Path(run_env["AUTOTUNE_HOME"]) / "logs" / study_name
    for t in failed:
        kept = Path(t.user_attrs["logs"])
        assert kept == logs / f"trial-{t.number}"
        text = {r: (kept / f"rank-{r}.log").read_text() for r in (0, 1)}
        assert any("this model refuses micro-batches of 8" in x for x in text.values()), text
    assert (Path(trials[0].user_attrs["logs"]) / "rank-0.log").exists()  # the baseline's
    for t in later:
        assert "logs" not in t.user_attrs and not (logs / f"trial-{t.number}").exists()
    assert sorted(d.name for d in logs.iterdir()) == sorted(
        ["limit", *(f"trial-{t.number}" for t in [trials[0], *failed])]
    )
    # the limit probes' traces, one per probed configuration, replaced by the next run's
    assert {p.name for p in (logs / "limit").iterdir()} <= {
        "baseline.trace.json",
        "tuned.trace.json",
    }


def test_kill_9_then_the_same_command_resumes_the_study(ray_address, run_env, tmp_path):
    import signal

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    args = (
        "--study",
        "quick",
        "--trainer",
        "autotune_test_trainers:tiny",
        "--trainer-option",
        f"pid_dir={pid_dir}",
        "--no-limit",  # what kill -9 leaves and the resume closes, not the limit, is checked
        "--address",
        ray_address,
    )
    name = "quick-autotune_test_trainers.tiny-gloo-2r"
    p = started_run(run_env, *args, "--budget", "5m", cwd=TESTS_DIR, after_trials=2)
    try:
        # kill -9 while a trial is running: wait until the study shows one (a trial of the
        # tiny model can be pruned within a second, and the next one is not asked for at once)
        wait_for(trial_running(run_env["AUTOTUNE_HOME"], name, number=2, started=False), 60)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        p.kill()
    before = local_study(run_env, name).trials
    assert before[-1].state == TrialState.RUNNING  # what kill -9 leaves behind
    measured = (TrialState.COMPLETE, TrialState.PRUNED)  # pruned trials keep partial numbers
    complete = {t.number: t.user_attrs["throughput"] for t in before if t.state in measured}
    assert len(complete) >= 2
    # Ray kills the actors of a dead driver: no rank process of the killed run is left.
    pids = [int(f.name) for f in pid_dir.iterdir()]
    wait_for(lambda: not any(Path(f"/proc/{q}").exists() for q in pids), 60, every=0.5)
    assert not [q for q in pids if Path(f"/proc/{q}").exists()]

    out = autotune(
        run_env,
        "run",
        *args,
        "--budget",
        "5m",
        "--n-trials",
        "1",
        "--validate-top",
        "0",
        cwd=TESTS_DIR,
    ).stdout
    assert f"Closed 1 trial(s) left RUNNING by a driver that died: {before[-1].number}" in out
    after = local_study(run_env, name).trials
    killed = after[before[-1].number]
    assert killed.state == TrialState.FAIL and killed.user_attrs["reason"] == "interrupted"
    assert {t.number: t.user_attrs["throughput"] for t in after if t.number in complete} == complete
    assert runs_of_the_defaults(after)[0] == 0
    assert not [t for t in after if t.state == TrialState.RUNNING]
    assert len(after) > len(before)


def test_a_second_ctrl_c_exits_at_once_and_a_resume_finds_the_study_consistent(
    ray_address, run_env
):
    import signal

    args = ("--study", "quick", "--address", ray_address)
    p = started_run(run_env, *args, "--budget", "5m")
    try:
        assert wait_for(trial_running(run_env["AUTOTUNE_HOME"], STUDY), 60)
        p.send_signal(signal.SIGINT)
        # as a person does: the second once the first is acknowledged (two signals close
        # together are the unit test's case, tests/unit/test_failures.py)
        said = []
        for line in p.stdout:
            said.append(line)
            if "Ctrl-C again to exit at once" in line:
                break
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
        out = "".join(said) + out
    finally:
        p.kill()
    assert p.returncode == 130, out  # what the run said after the first trial, if not
    autotune(run_env, "run", *args, "--budget", "5s")
    home = Path(run_env["AUTOTUNE_HOME"])
    trials = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{home / 'autotune.db'}").trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert runs_of_the_defaults(trials)[0] == 0


def test_nccl_on_a_cluster_without_gpus_is_refused_before_anything_is_written(ray_address, run_env):
    p = autotune(
        run_env,
        "run",
        "--study",
        "quick",
        "--backend",
        "nccl",
        "--budget",
        "10s",
        "--address",
        ray_address,
        rc=2,
    )
    assert "autotune: error: --backend nccl: the Ray cluster has no GPU" in p.stderr
    assert not Path(run_env["AUTOTUNE_HOME"]).exists()


def group_of(pgid: int) -> list[str]:
    """The processes of process group ``pgid``: pid and name."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(f"{stat.parent.name} {text[text.index('(') + 1 : text.rindex(')')]}")
    return out


def children_named(pid: int, name: str) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        if comm == name and int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            return True
    return False


@pytest.mark.parametrize(("signum", "rc"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupt_while_the_local_ray_instance_starts_leaves_no_process(run_env, signum, rc):
    import signal

    # its own session: the process group it and everything it starts stay in is its pid
    p = subprocess.Popen(
        autotune_cmd("run", "--study", "quick", "--budget", "1m"),
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # the raylet runs: ray.init is waiting for it, and it is starting its agents (an
        # interrupt here used to leave DashboardAgent and RuntimeEnvAgent running)
        wait_for(lambda: children_named(p.pid, "raylet"), 60, every=0.05)
        assert p.poll() is None, p.communicate()[0]
        p.send_signal(getattr(signal, signum))
        out = p.communicate(timeout=60)[0]
    finally:
        p.kill()
    assert p.returncode == rc, out
    assert group_of(p.pid) == [], out
    assert RAY_AUTH_WARNING not in out  # set explicitly, before ray.init
    # nothing was measured: no profile
    assert not (Path(run_env["AUTOTUNE_HOME"]) / "profiles").exists()
