"""``--log-to mlflow|wandb|tensorboard``: each trial of the run, and its result, recorded in an
experiment tracker as well as in the study.

``Trackers`` is an event sink (``autotune.core.events``) made as the run starts, before
Ray: it ``check``s the names, and a tracker whose library is not installed is a one-line
``ConfigError``. ``open`` opens the trackers once the study is open. The sink passes every
event on to the run's own ``emit`` and, for each ``TrialFinished``, records the trial as the
study holds it once Optuna has told it (its final state, its params and what autotune stored
on it: ``report.tracker_clients.TrialRecord``). ``close`` records the run's result (the
exported profile's speedup and path, ``RunResult``) and ends the trackers' runs. Why these
clients and not Optuna's integration callbacks: ``report.tracker_clients``.

Trial threads never wait on a tracker: the records are written by one writer thread of its
own, the only one that calls the trackers' clients. A tracker that fails (a full disk, a
server gone) is said once, in a note, and left out from then on; the run goes on.
"""

from __future__ import annotations

import importlib.util
import queue
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from autotune.core.errors import ConfigError
from autotune.core.events import Emit, Note, TrialFinished
from autotune.definition.studydef import StudyDefinition
from autotune.launch.failures import first_line
from autotune.profile.profile import Profile
from autotune.report.tracker_clients import Client, RunResult, TrialRecord, open_client

__all__ = ["TRACKERS", "Summary", "Trackers", "check", "names", "run_result"]

#: Each tracker: (the module it needs, the package that installs it, its name for people).
TRACKERS = {
    "mlflow": ("mlflow", "mlflow-skinny", "MLflow"),
    "tensorboard": ("tensorboard", "tensorboard", "TensorBoard"),
    "wandb": ("wandb", "wandb", "W&B"),
}
#: How often the writer looks whether a finished trial's end is stored yet.
POLL_S = 0.5
#: How long ``close`` waits for the writer to record what is left and end the trackers' runs.
CLOSE_WAIT_S = 60.0

_STOP = object()


class Summary(Protocol):
    """What ``finish`` reads of the run's summary (``tuner.RunSummary``)."""

    study_name: str
    profile_path: Path | None
    trials: dict[str, int]
    stopped: str | None
    interrupted: bool


def names(values: Iterable[str]) -> list[str]:
    """The trackers ``--log-to`` names: repeated or comma-separated, each once, in order."""
    out: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip().lower()
            if name and name not in out:
                out.append(name)
    return out


def check(values: Iterable[str]) -> None:
    """Every tracker ``values`` names is known and its library installed; else a one-line
    ``ConfigError`` saying what to install. Imports nothing."""
    for name in names(values):
        if name not in TRACKERS:
            raise ConfigError(f"--log-to {name}: not a tracker; choose from {', '.join(TRACKERS)}")
        module, package, _ = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"--log-to {name} needs {module}: pip install {package}")


def run_result(summary: Summary) -> RunResult:
    """The run's result: the exported profile's figures (``summary.profile_path``; none when
    nothing was exported) and why the run stopped."""
    metrics = {f"trials_{k}": float(v) for k, v in summary.trials.items()}
    profile = None
    if summary.profile_path is not None:
        try:
            profile = Profile.load(summary.profile_path)
        except (OSError, ConfigError):
            profile = None
    headline, best = "", None
    validated = False
    if profile is not None:
        m = profile.measured
        ci = m.get("speedup_interval")
        found = {
            "speedup": m.get("speedup"),
            "baseline_throughput": m.get("baseline_samples_per_s"),
            "best_throughput": m.get("best_samples_per_s"),
        }
        if isinstance(ci, list) and len(ci) == 2:
            found.update(speedup_low=ci[0], speedup_high=ci[1])
        metrics.update({k: float(v) for k, v in found.items() if _number(v)})
        headline, validated = profile.headline(), bool(m.get("validation"))
        best = profile.study.get("best_trial")
    return RunResult(
        study=summary.study_name,
        headline=headline,
        profile="" if profile is None else str(summary.profile_path),
        best_trial=best if isinstance(best, int) else None,
        validated=validated,
        metrics=metrics,
        stopped=summary.stopped or "",
        interrupted=summary.interrupted,
    )


class Trackers:
    """The event sink of ``--log-to``: every event goes on to ``emit``; once ``open``, a
    finished trial and the run's result also go to each tracker, from the writer thread.
    Made before the run starts (``close`` it in a ``finally``); opened once the study is."""

    def __init__(self, emit: Emit, values: Iterable[str] = ()) -> None:
        """``values``: the trackers ``--log-to`` names, checked now (``check``: a one-line
        ``ConfigError``), before anything starts."""
        check(values)
        self.names = names(values)
        self.emit = emit
        self.study: optuna.Study | None = None
        self.clients: dict[str, Client] = {}
        self._queue: queue.Queue[Any] = queue.Queue()
        self._said: set[int] = set()  # trials recorded
        self._first = 0
        self._result: RunResult | None = None
        self._summary: Summary | None = None
        self._thread: threading.Thread | None = None

    def open(
        self,
        study: optuna.Study,
        run_dir: Path,
        config: Mapping[str, Any] | StudyDefinition,
        summary: Summary | None = None,
    ) -> Trackers:
        """Open each tracker for ``study``; ``config`` (the study definition or its settings)
        is logged as the run's parameters. Says where each one writes; one that cannot be
        opened is said and left out. ``summary``: the run's summary, filled as the run ends
        (``tuner.RunSummary``): ``close`` records the result it then holds. Returns the sink."""
        self._summary = summary
        settings = asdict(config) if isinstance(config, StudyDefinition) else dict(config)
        for name in self.names:
            label = TRACKERS[name][2]
            try:
                client = open_client(name, study=study.study_name, run_dir=run_dir, config=settings)
            except Exception as e:  # noqa: BLE001 - a tracker never stops the run
                self.emit(
                    Note(
                        f"--log-to {name}: {label} could not be opened ({_error(e)}); "
                        "the run goes on without it"
                    )
                )
                continue
            self.clients[name] = client
            self.emit(Note(f"Logging each trial to {label}: {client.where}"))
        if self.clients and self._thread is None:
            self.study = study
            #: the trials this run adds (a resumed study's earlier ones were recorded then)
            self._first = len(study.get_trials(deepcopy=False))
            self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
            self._thread.start()
        return self

    def __call__(self, event: Any) -> None:
        """Pass ``event`` on; a ``TrialFinished`` is recorded once its trial's end is stored."""
        self.emit(event)
        if isinstance(event, TrialFinished) and self._thread is not None:
            self._queue.put(event.number)

    def trial(self, t: FrozenTrial) -> None:
        """Record ``t``, a finished trial, as it is."""
        if self._thread is not None:
            self._queue.put(t)

    def finish(self, summary: Summary) -> None:
        """Record the run's result (``run_result``): sent once the trials are, by ``close``."""
        self._summary = None
        if self._thread is not None:
            try:
                self._queue.put(run_result(summary))
            except Exception as e:  # noqa: BLE001 - a tracker never stops the run
                self.emit(Note(f"--log-to: the run's result was not recorded ({_error(e)})"))

    def close(self) -> None:
        """Record what is left, and the result when the summary ``open`` was given holds one
        (the run got to its export: its trials are counted) or ``finish`` was called; end
        each tracker's run: finished, killed when the run was interrupted, else failed.
        Waits at most ``CLOSE_WAIT_S``; never raises; a second call does nothing."""
        if self._summary is not None and self._summary.trials:
            self.finish(self._summary)
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_STOP)
        try:
            thread.join(CLOSE_WAIT_S)
        except KeyboardInterrupt:  # Ctrl-C again: the run ends now, the trackers as they are
            return
        if thread.is_alive():
            self.emit(
                Note(
                    f"--log-to: the trackers did not finish writing within "
                    f"{CLOSE_WAIT_S:.0f} s; the run ends without them"
                )
            )

    def _work(self) -> None:
        pending: set[int] = set()  # trials said finished, their end not seen stored yet
        while True:
            try:
                item = self._queue.get(timeout=POLL_S if pending else None)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            if isinstance(item, int):
                pending.add(item)
            elif isinstance(item, FrozenTrial):
                self._said.add(item.number)
                self._send("trial", TrialRecord.of(item))
            elif isinstance(item, RunResult):
                self._result = item
            self._sweep(pending)
        self._sweep(pending | self._unsaid())
        status = "FAILED"
        if self._result is not None:
            self._send("result", self._result)
            status = "KILLED" if self._result.interrupted else "FINISHED"
        self._send("close", status)

    def _unsaid(self) -> set[int]:
        """This run's trials that no ``TrialFinished`` announced (ended on a path that says
        nothing of them), for the last sweep."""
        try:
            assert self.study is not None
            trials = self.study.get_trials(deepcopy=False)
        except Exception:  # noqa: BLE001 - the run says the storage's failure itself
            return set()
        return {t.number for t in trials[self._first :]} - self._said

    def _sweep(self, pending: set[int]) -> None:
        """Record each trial of ``pending`` whose end the study holds now. A trial whose end
        is never stored (the storage failed) is not recorded."""
        if not pending:
            return
        try:
            assert self.study is not None
            trials = self.study.get_trials(deepcopy=False)
        except Exception:  # noqa: BLE001 - the run says the storage's failure itself
            return
        for t in trials:
            if t.number in pending and t.state.is_finished():
                pending.discard(t.number)
                self._said.add(t.number)
                self._send("trial", TrialRecord.of(t))

    def _send(self, what: str, arg: Any) -> None:
        """Call ``what`` on every tracker still in; one that fails is said once and left out."""
        for name, client in list(self.clients.items()):
            try:
                getattr(client, what)(arg)
            except Exception as e:  # noqa: BLE001 - a tracker never stops the run
                del self.clients[name]
                label = TRACKERS[name][2] if name in TRACKERS else name
                self.emit(
                    Note(
                        f"--log-to {name}: {label} failed ({_error(e)}); nothing more "
                        "is logged to it, the run goes on"
                    )
                )


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(str(e))}"


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
