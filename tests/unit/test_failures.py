"""The failure classifiers on captured error texts (gloo, Ray, CUDA), wrapped in Ray's own
exception classes as the driver receives them, and the reasons the sampler learns from."""

from __future__ import annotations

import pytest
import ray.exceptions as rex

from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.rank_io import MemoryLimitExceeded, NonFiniteLoss
from autotune.launch.failures import (
    classify,
    death_line,
    first_line,
    gone_away,
    last_words,
    learned_reasons,
)

#: What a surviving gloo rank raised when its peer's node was killed (seen in the node-loss
#: tests; the path is the one in torch's wheel).
GLOO_PEER_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
    "Connection closed by peer [10.213.0.2]:41937"
)
#: torch's store client, on the surviving node, when the node holding the store was killed.
STORE_GONE = (
    "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown "
    "or crash?"
)
GLOO_RESET = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer "
    "[127.0.0.1]:29500"
)
#: Ray's message for an actor whose worker process was SIGKILLed.
RAY_PROCESS_DIED = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: RankActor\n"
    "\tactor_id: 5b1a4d2f9e0c7a6b3c8d1e2f01000000\n"
    "\tpid: 41211\n"
    "\tnamespace: 2f0c9b3e-7f5d-4f0e-9a61-1d6e2c1b5a10\n"
    "\tip: 127.0.0.1\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file."
)
#: Ray's message for an actor on a node that left the cluster.
RAY_NODE_DIED = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: RankActor\n"
    "\tactor_id: 9e0c7a6b3c8d1e2f5b1a4d2f01000000\n"
    "\tip: 10.213.0.2\n"
    "The actor is dead because its node has died. Node Id: "
    "3f2a1c9d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d"
)
#: torch's CUDA out-of-memory message (torch.OutOfMemoryError).
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 3.12 GiB is free. Of the allocated memory 74.50 GiB is allocated by PyTorch"
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/x/rank.py", line 210, in _run_rank\n'
    "    loss = wl.loss(ddp(x), y) / accum\n"
    "    ^^^^^^^^^^^^^^\n"
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x30 and 32x8)\n"
)


def task_error(cause: BaseException) -> rex.RayTaskError:
    """What ``ray.get`` raises when the rank's method raised ``cause``."""
    try:
        raise cause
    except BaseException as c:
        return rex.RayTaskError("RankActor.run", TRACEBACK, c).as_instanceof_cause()


class OutOfMemoryError(RuntimeError):
    """Stands for torch.OutOfMemoryError: the classifier reads the type's name."""


@pytest.mark.parametrize(
    ("err", "reason", "detail"),
    [
        (
            rex.RayActorError(error_msg=RAY_PROCESS_DIED),
            "crash",
            "rank 1: its process died (The actor is dead because its worker process has died.",
        ),
        (
            rex.RayActorError(error_msg=RAY_NODE_DIED),
            "node_lost",
            "rank 1: its node was lost (The actor is dead because its node has died.",
        ),
        (
            task_error(RuntimeError(GLOO_PEER_CLOSED)),
            "crash",
            f"rank 1: RuntimeError: {GLOO_PEER_CLOSED}",
        ),
        (
            task_error(NonFiniteLoss("loss is nan after 3 warm-up steps")),
            "nan",
            "rank 1: loss is nan after 3 warm-up steps",
        ),
        (
            task_error(OutOfMemoryError(CUDA_OOM)),
            "oom",
            "rank 1: OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.",
        ),
        (
            task_error(
                MemoryLimitExceeded("peak host memory 900 MiB is over --max-memory 512 MiB")
            ),
            "oom",
            "rank 1: MemoryLimitExceeded: peak host memory 900 MiB",
        ),
        (
            task_error(ValueError("trainer option width must be positive")),
            "crash",
            "rank 1: ValueError: trainer option width must be positive",
        ),
    ],
)
def test_each_captured_error_gets_its_reason_and_first_line(err, reason, detail):
    f = classify(1, err)
    assert isinstance(f, TrialFailed) and f.reason == FailureReason(reason)
    assert f.detail.startswith(detail), f.detail


def test_a_peer_that_went_away_is_told_from_a_ranks_own_error():
    # the lost-node diagnosis only asks the cluster when every error is of this kind
    assert gone_away(classify(0, task_error(RuntimeError(GLOO_PEER_CLOSED))))
    assert gone_away(classify(0, task_error(RuntimeError(GLOO_RESET))))
    assert gone_away(classify(1, task_error(RuntimeError(STORE_GONE))))
    assert gone_away(classify(0, rex.RayActorError(error_msg=RAY_PROCESS_DIED)))
    assert not gone_away(classify(0, task_error(ValueError("bad shape"))))
    assert not gone_away(classify(0, task_error(OutOfMemoryError(CUDA_OOM))))


def test_first_line_skips_traceback_noise_and_is_bounded():
    assert first_line(TRACEBACK) == "loss = wl.loss(ddp(x), y) / accum"
    assert first_line("\n\nray::RankActor.run()\nValueError: x") == "ValueError: x"
    assert len(first_line("y" * 1000)) == 300


def test_death_line_is_the_reason_after_rays_indented_details():
    assert death_line(RAY_NODE_DIED).startswith("The actor is dead because its node has died.")
    assert death_line("only one line") == "only one line"


#: The end of a rank's log whose process glibc aborted mid-step (a compiled trial that loaded
#: kernels built for another CPU capability), as Ray's and Abseil's handlers and Python's
#: faulthandler left it; trimmed.
GLIBC_ABORT_LOG = "\n".join(
    (
        "malloc(): unaligned tcache chunk detected",
        "*** SIGABRT received at time=1796167087 on cpu 1 ***",
        "PC: @     0x7fec742a8eec  (unknown)  (unknown)",
        "    @     0x7fec7425a050   66635920  (unknown)",
        "[2026-12-01 23:18:07,269 E 4195 4195] logging.cc:474: *** SIGABRT received at "
        "time=1796167087 on cpu 1 ***",
        "malloc(): unaligned tcache chunk detected",
        "[failure_signal_handler.cc : 345] RAW: Signal 6 raised at PC=0x7f655c4a8eec while "
        "already in AbslFailureSignalHandler()",
        "Fatal Python error: Aborted",
        "",
        "Stack (most recent call first):",
        '  File "/site-packages/torch/autograd/function.py", line 625 in apply',
        '  File "/site-packages/torch/_dynamo/eval_frame.py", line 1446 in _fn',
        "",
        "Extension modules: msgpack._cmsgpack, google._upb._message, torch._C (total: 61)",
        "",
    )
)


def test_a_dead_processs_last_words_are_its_own_not_its_crash_handlers():
    assert last_words(GLIBC_ABORT_LOG) == (
        "malloc(): unaligned tcache chunk detected; Fatal Python error: Aborted"
    )
    assert last_words("free(): invalid pointer\n*** SIGABRT received at time=1 ***\n") == (
        "free(): invalid pointer"
    )
    assert last_words("malloc_consolidate(): invalid chunk size\n") == (
        "malloc_consolidate(): invalid chunk size"
    )
    cpp = "terminate called after throwing an instance of 'c10::Error'\n  what():  bad thing\n"
    assert (
        last_words(cpp)
        == "terminate called after throwing an instance of 'c10::Error'; what():  bad thing"
    )
    # a process killed outright wrote nothing of why: its last ordinary lines are not reasons
    assert last_words("step 3 loss 0.41\nstep 4 loss 0.40\n") == ""
    assert last_words("") == ""
    assert len(last_words("RuntimeError: " + "x" * 1000)) == 200


def test_a_rank_that_died_is_named_by_its_own_log_where_it_wrote_one(tmp_path):
    from autotune.launch.launcher import _with_last_words

    died = TrialFailed(FailureReason.CRASH, "rank 1: its process died (Worker unexpectedly exits)")
    (tmp_path / "rank-1.log").write_text(GLIBC_ABORT_LOG)
    named = _with_last_words(died, 1, str(tmp_path))
    assert named.reason == FailureReason.CRASH
    assert named.detail == (
        "rank 1: its process died: malloc(): unaligned tcache chunk detected; Fatal Python "
        f"error: Aborted (its output: {tmp_path / 'rank-1.log'})"
    )
    assert gone_away(named)  # still a process gone: a lost node is still looked for
    # as it was: no log kept, no log of that rank, nothing said of why, a rank's own error
    assert _with_last_words(died, 1, None) is died
    assert _with_last_words(died, 0, str(tmp_path)).detail == died.detail
    (tmp_path / "rank-1.log").write_text("step 4 loss 0.40\n")
    assert _with_last_words(died, 1, str(tmp_path)) is died
    raised = TrialFailed(FailureReason.CRASH, "rank 1: RuntimeError: boom")
    assert _with_last_words(raised, 1, str(tmp_path)) is raised


def test_the_sampler_learns_from_configuration_failures_only():
    learned = {r for r in FailureReason if r.learned}
    assert learned == {
        FailureReason.CRASH,
        FailureReason.TIMEOUT,
        FailureReason.OOM,
        FailureReason.NAN,
        FailureReason.ILLEGAL,
        FailureReason.NUMERICS_DRIFT,
        FailureReason.KNOWN_FAILING,  # not run, but the sampler moves further away
    }
    assert learned_reasons() == {r.value for r in learned}
    for outside in ("node_lost", "interrupted", "cluster_lost"):
        assert not FailureReason(outside).learned


def test_a_reason_is_stored_and_printed_as_its_tag():
    f = TrialFailed("timeout", "no result after 30s from rank(s) [1]")
    assert f.reason is FailureReason.TIMEOUT and f.reason == "timeout"
    assert str(f) == "timeout: no result after 30s from rank(s) [1]"
    assert f"{f.reason}" == "timeout"
    with pytest.raises(ValueError):
        TrialFailed("exploded")  # no reason outside the enum


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler (KeyboardInterrupt in the main thread) for the test: an
    earlier test of the session, or Ray in this process, may have installed another."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_lands_on_the_main_thread_and_the_running_trial_is_recorded_interrupted(
    monkeypatch, ctrl_c_raises
):
    """Trials run on worker threads, so Ctrl-C never lands inside Optuna's ask or tell (it
    once left a trial RUNNING): the main thread aborts the measurement, and the trial's own
    thread records it FAIL with the reason ``interrupted``. A replayed run on real Optuna
    storage; the third trial blocks until it is aborted, as killed ranks would."""
    import signal
    import threading

    import optuna
    from optuna.trial import TrialState

    from autotune.replay import simulate as rp
    from tests.conftest import REPO

    running = threading.Event()

    class KilledRanks(rp.ReplayMeasurer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.killed = threading.Event()

        def abort(self) -> None:
            self.killed.set()

        def __call__(self, number, config, *a, **k):
            if number < 2:
                return super().__call__(number, config, *a, **k)
            running.set()
            assert self.killed.wait(30), "Ctrl-C did not abort the measurement"
            raise TrialFailed("crash", "rank 0 exited with status -9")

    def ctrl_c() -> None:
        if running.wait(30):
            # Python's handler raises KeyboardInterrupt in the main thread
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    monkeypatch.setattr(rp, "ReplayMeasurer", KilledRanks)
    storage = optuna.storages.InMemoryStorage()
    threading.Thread(target=ctrl_c, daemon=True).start()
    land = rp.Landscape.load(REPO / "bench" / "landscapes" / "default-loopback.json")
    with pytest.raises(KeyboardInterrupt):
        rp.replay(land, seed=0, storage=storage)
    trials = optuna.load_study(study_name="replay", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL]
    assert trials[2].user_attrs["reason"] == "interrupted"
    assert trials[2].user_attrs["reason_detail"] == "Ctrl-C during the trial"


def test_a_second_ctrl_c_while_the_first_waits_for_the_trials_exits_at_once(
    monkeypatch, ctrl_c_raises
):
    """Ctrl-C pressed twice in quick succession: the second lands while the first waits for the
    aborted trials to be recorded (up to ``ABORT_WAIT_S``). It is not taken for the first
    again (which would go on to export, and make the user press a third time): it raises
    ``InterruptedAgain`` at once, which the run lets through."""
    import signal
    import threading
    import time

    import optuna

    from autotune.core.errors import InterruptedAgain
    from autotune.replay import simulate as rp
    from autotune.search.loop import ABORT_WAIT_S
    from tests.conftest import REPO

    running, aborted, release = threading.Event(), threading.Event(), threading.Event()

    class StuckRanks(rp.ReplayMeasurer):
        def abort(self) -> None:
            aborted.set()

        def __call__(self, number, config, *a, **k):
            if number < 2:
                return super().__call__(number, config, *a, **k)
            running.set()
            release.wait(60)  # ranks that take their time to die
            raise TrialFailed("crash", "rank 0 exited with status -9")

    def ctrl_c_twice() -> None:
        main = threading.main_thread().ident
        if running.wait(30):
            signal.pthread_kill(main, signal.SIGINT)
            if aborted.wait(30):
                time.sleep(0.3)  # the main thread is now waiting for the trial
                signal.pthread_kill(main, signal.SIGINT)

    monkeypatch.setattr(rp, "ReplayMeasurer", StuckRanks)
    threading.Thread(target=ctrl_c_twice, daemon=True).start()
    land = rp.Landscape.load(REPO / "bench" / "landscapes" / "default-loopback.json")
    started = time.monotonic()
    try:
        with pytest.raises(InterruptedAgain):
            rp.replay(land, seed=0, storage=optuna.storages.InMemoryStorage())
        assert time.monotonic() - started < ABORT_WAIT_S / 2
    finally:
        release.set()


def test_ctrl_c_while_a_trial_is_told_leaves_no_trial_running(ctrl_c_raises):
    """The interrupt of the CI failure: Ctrl-C while Optuna tells the storage a trial's end.
    Raised in the storage's write of trial 2's state, it lands on the waiting main thread; the
    worker finishes the write, so trial 2 keeps its measurement and nothing is left RUNNING
    (with the trial on the main thread, the write was cut and the trial stayed RUNNING)."""
    import signal
    import threading

    import optuna
    from optuna.trial import TrialState

    from autotune.replay.simulate import Landscape, replay
    from tests.conftest import REPO

    taken = threading.Event()

    def take(signum, frame):  # Python's own handler, which also says when it ran
        taken.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, take)  # ctrl_c_raises puts the previous one back

    class InterruptedWrite(optuna.storages.InMemoryStorage):
        def set_trial_state_values(self, trial_id, state, values=None):
            if self.get_trial_number_from_id(trial_id) == 2 and state.is_finished():
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                assert taken.wait(30)  # the main thread takes the signal meanwhile
            return super().set_trial_state_values(trial_id, state, values)

    storage = InterruptedWrite()
    land = Landscape.load(REPO / "bench" / "landscapes" / "default-loopback.json")
    with pytest.raises(KeyboardInterrupt):
        replay(land, seed=0, storage=storage)
    trials = optuna.load_study(study_name="replay", storage=storage).trials
    # trial 2 (here the first measurement put the 5 MB buckets' screening trial second, ahead
    # of the fp16 hook, which is pruned) keeps the end it was told: measured, not RUNNING
    assert len(trials) == 3 and trials[0].state == trials[1].state == TrialState.COMPLETE
    assert trials[2].state in (TrialState.COMPLETE, TrialState.PRUNED)


def test_a_trial_failure_survives_a_pickle_as_itself():
    """A script trial fails inside a Ray task: Ray pickles the exception to the driver."""
    import pickle

    e = pickle.loads(pickle.dumps(TrialFailed("timeout", "not measured after 60s (3 steps)")))
    assert type(e) is TrialFailed
    assert e.reason is FailureReason.TIMEOUT and e.detail == "not measured after 60s (3 steps)"
    assert str(e) == "timeout: not measured after 60s (3 steps)"
