"""The records ``--log-to`` sends (``TrialRecord``, ``RunResult``) and one client per tracker,
each on the tracker's own public client: ``mlflow.MlflowClient``, a ``wandb`` run, and
PyTorch's ``torch.utils.tensorboard.SummaryWriter`` (TensorBoard's event files).

Why not Optuna's integration callbacks (``optuna_integration.MLflowCallback``,
``WeightsAndBiasesCallback``, ``TensorBoardCallback``): all three are deprecated since
optuna-integration 4.9 (removal in 6.0); the TensorBoard one needs TensorFlow and skips every
trial that is not COMPLETE, so a FAIL trial and its reason never reach TensorBoard; the other
two log a trial's objective values (None for FAIL and PRUNED) and params, and none of what
autotune stores on the trial (the throughput's interval, the reason); the MLflow and W&B ones
work on the libraries' process-wide state (``mlflow.set_tracking_uri``, ``wandb.run``), and
the search calls ``study.optimize`` from one thread per placement group. So each tracker gets
a small client here, fed by ``report.trackers`` from one writer thread.

Per trial, every tracker gets the same ``TrialRecord``: its params, state, the throughput with
its 95 % interval, the speedup, and on a FAIL trial the reason. Per run, a ``RunResult``: the
exported profile's speedup with its interval, the profile's path, the trial counts, and why
the run stopped early when it did.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from optuna.trial import FrozenTrial, TrialState

from autotune.core.values import speedup
from autotune.definition.paths import file_stem
from autotune.record import trial as tr

__all__ = ["Client", "RunResult", "TrialRecord", "flat", "open_client"]

#: The numbers of a trial's record, as every tracker names them.
TRIAL_METRICS = ("throughput", "interval_low", "interval_high", "rel_half_width", "speedup")


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One finished trial, as the trackers record it."""

    number: int
    state: str
    """``COMPLETE``, ``PRUNED`` or ``FAIL`` (Optuna's state)."""
    params: dict[str, Any]
    metrics: dict[str, float]
    """``TRIAL_METRICS`` that were measured, ``wall_s``, and ``peak_memory_mb`` (the second
    objective of a throughput,memory study)."""
    reason: str = ""
    """A FAIL trial's reason (a ``FailureReason`` value), and its detail."""
    detail: str = ""
    baseline: bool = False
    """A run of the defaults (the baseline or a later anchor)."""
    start_ms: int | None = None
    end_ms: int | None = None

    @classmethod
    def of(cls, t: FrozenTrial) -> TrialRecord:
        found = {k: tr.measured(t, k) for k in ("throughput", "speedup", "wall_s")}
        rec = tr.interval_record(t)
        if rec is not None:
            found.update(interval_low=rec.low, interval_high=rec.high)
            found.update(rel_half_width=rec.rel_half_width)
        metrics = {k: float(v) for k, v in found.items() if v is not None}
        if t.state == TrialState.COMPLETE and t.values is not None and len(t.values) > 1:
            metrics["peak_memory_mb"] = float(t.values[1])
        failed = t.state == TrialState.FAIL
        return cls(
            number=t.number,
            state=t.state.name,
            params=dict(t.params),
            metrics=metrics,
            reason=tr.reason(t) if failed else "",
            detail=tr.reason_detail(t) if failed else "",
            baseline=tr.is_baseline(t),
            start_ms=_ms(t.datetime_start),
            end_ms=_ms(t.datetime_complete),
        )

    def line(self) -> str:
        """``COMPLETE 512.0 samples/s (95% 500.1-520.3) 1.21x`` or ``FAIL timeout: detail``."""
        m = self.metrics
        if self.state == "FAIL":
            return f"FAIL {self.reason}: {self.detail}" if self.detail else f"FAIL {self.reason}"
        text = f"{self.state} {m.get('throughput', float('nan')):.1f} samples/s"
        if "interval_low" in m and "interval_high" in m:
            text += f" (95% {m['interval_low']:.1f}-{m['interval_high']:.1f})"
        return text + (f" {speedup(m['speedup'])}" if "speedup" in m else "")

    def flat_params(self) -> dict[str, Any]:
        return flat(self.params)


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What the run ended with: the exported profile's figures and why it stopped."""

    study: str
    headline: str = ""
    """The profile's one line (``Profile.headline``): its speedup, re-validated or not."""
    profile: str = ""
    """The exported profile's path ("" when none was exported)."""
    best_trial: int | None = None
    validated: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    """``speedup``, ``speedup_low``, ``speedup_high``, ``baseline_throughput``,
    ``best_throughput``, and ``trials_complete`` / ``_failed`` / ``_pruned`` / ``_total``."""
    stopped: str = ""
    """Why the run stopped before its budget ("" when it did not)."""
    interrupted: bool = False

    def tags(self) -> dict[str, str]:
        """The result's words, as text."""
        best = "" if self.best_trial is None else str(self.best_trial)
        return {
            "result": self.headline,
            "profile": self.profile,
            "best_trial": best,
            "validated": str(self.validated).lower(),
            "stopped": self.stopped,
            "interrupted": str(self.interrupted).lower(),
        }

    def line(self) -> str:
        text = self.headline or "no profile exported"
        if self.profile:
            text += f"; profile {self.profile}"
        return text + (f"; stopped: {self.stopped}" if self.stopped else "")


class Client(Protocol):
    """One tracker, called from the writer thread only."""

    where: str
    """Where it writes, for the line the run says when it opens."""

    def trial(self, rec: TrialRecord) -> None: ...

    def result(self, res: RunResult) -> None: ...

    def close(self, status: str) -> None:
        """End the tracker's run: ``status`` is ``FINISHED``, ``KILLED`` or ``FAILED``."""


def open_client(name: str, *, study: str, run_dir: Path, config: Mapping[str, Any]) -> Client:
    """The client of tracker ``name`` (``mlflow``, ``wandb`` or ``tensorboard``), opened."""
    if name == "mlflow":
        return MlflowTracker(study=study, run_dir=run_dir, config=config)
    if name == "wandb":
        return WandbTracker(study=study, run_dir=run_dir, config=config)
    return TensorBoardTracker(study=study, run_dir=run_dir, config=config)


class MlflowTracker:
    """MLflow: an experiment named after the study (``MLFLOW_EXPERIMENT_NAME`` overrides it), a
    parent run per ``autotune run`` with the definition as params and the result as metrics
    and tags (the profile as an artifact), and a nested run per trial. The tracking URI is
    ``MLFLOW_TRACKING_URI`` when set, else a SQLite store in the run directory; a local store's
    artifacts go to ``RUN_DIR/mlruns`` (a server's: where the server keeps them)."""

    def __init__(self, *, study: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        from mlflow import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store's set-up, said INFO
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.resolve()}/mlflow.db"
        local = urlsplit(uri).scheme in ("sqlite", "file", "")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or study
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            self.experiment = found.experiment_id
        else:  # a local store's artifacts in the run directory, not the working directory
            where = (run_dir / "mlruns").resolve().as_uri() if local else None
            self.experiment = self.client.create_experiment(name, artifact_location=where)
        tags = {"autotune.study": study, "autotune.kind": "run"}
        self.run = self.client.create_run(self.experiment, run_name=study, tags=tags).info.run_id
        self._log(self.run, params=flat(config))
        self.where = f"experiment {name!r} at {_no_password(uri)} (run {self.run})"

    def _log(
        self,
        run: str,
        *,
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        step: int = 0,
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = _ms_now()
        self.client.log_batch(
            run,
            metrics=[Metric(k, float(v), now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)[:8000]) for k, v in (tags or {}).items()],
        )

    def trial(self, rec: TrialRecord) -> None:
        tags = {
            "mlflow.parentRunId": self.run,
            "autotune.kind": "trial",
            "state": rec.state,
            "trial": str(rec.number),
            "baseline": str(rec.baseline).lower(),
        }
        if rec.state == "FAIL":
            tags.update(reason=rec.reason, reason_detail=rec.detail)
        name = f"trial {rec.number}" + (" (defaults)" if rec.baseline else "")
        run = self.client.create_run(
            self.experiment, run_name=name, start_time=rec.start_ms, tags=tags
        )
        run_id = run.info.run_id
        self._log(run_id, metrics=rec.metrics, params=rec.flat_params())
        status = "FAILED" if rec.state == "FAIL" else "FINISHED"
        self.client.set_terminated(run_id, status=status, end_time=rec.end_ms)
        # the parent's own curve of the search: throughput by trial number
        if "throughput" in rec.metrics:
            curve = {"trial_throughput": rec.metrics["throughput"]}
            self._log(self.run, metrics=curve, step=rec.number)

    def result(self, res: RunResult) -> None:
        self._log(self.run, metrics=res.metrics, tags=res.tags())
        if res.profile and Path(res.profile).is_file():
            self.client.log_artifact(self.run, res.profile)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run, status=status)


class WandbTracker:
    """Weights & Biases: one run per ``autotune run`` (project ``WANDB_PROJECT``, else
    ``autotune``; grouped by study), the definition as its config, one history row per trial
    (``trial`` is the step metric) and a ``trials`` table at the end, the result in the run's
    summary. ``WANDB_MODE=offline`` writes it all to disk (``wandb sync`` uploads it later);
    the files go under ``WANDB_DIR``, else the run directory."""

    def __init__(self, *, study: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "autotune",
            group=study,
            name=study,
            job_type="autotune-run",
            dir=os.environ.get("WANDB_DIR") or str(run_dir),
            config=flat(config),
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.run.define_metric("trial")
        for k in (*TRIAL_METRICS, "wall_s", "peak_memory_mb"):
            self.run.define_metric(k, step_metric="trial")
        self.rows: list[list[Any]] = []
        offline = self.run.settings.mode in ("offline", "dryrun")
        where = f"offline run in {Path(self.run.dir).parent} (wandb sync uploads it)"
        self.where = where if offline else str(self.run.url)

    def trial(self, rec: TrialRecord) -> None:
        row: dict[str, Any] = {"trial": rec.number, "state": rec.state, "baseline": rec.baseline}
        row.update(rec.metrics)
        if rec.state == "FAIL":
            row.update(reason=rec.reason, reason_detail=rec.detail)
        row.update({f"params/{k}": v for k, v in rec.flat_params().items()})
        self.run.log(row)
        m = rec.metrics
        self.rows.append(
            [
                rec.number,
                rec.state,
                rec.baseline,
                *(m.get(k) for k in TRIAL_METRICS),
                rec.reason,
                rec.detail,
                json.dumps(rec.params, default=str),
            ]
        )

    def result(self, res: RunResult) -> None:
        self.run.summary.update(
            {
                **{f"result/{k}": v for k, v in res.metrics.items()},
                **{f"result/{k}": v for k, v in res.tags().items()},
            }
        )

    def close(self, status: str) -> None:
        if self.rows:
            columns = ["trial", "state", "baseline", *TRIAL_METRICS]
            columns += ["reason", "reason_detail", "params"]
            self.run.log({"trials": self.wandb.Table(columns=columns, data=self.rows)})
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class TensorBoardTracker:
    """TensorBoard: event files under ``RUN_DIR/tensorboard/STUDY``. Per trial, step = the
    trial's number: scalars ``trial/<metric>`` and a text ``trial/record`` (its state, reason
    and params in one line), and a run ``trial-N`` with its params, state and reason as
    hparams (the HParams dashboard). Per run: scalars ``run/<metric>`` and a text
    ``run/result``."""

    def __init__(self, *, study: str, run_dir: Path, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = run_dir / "tensorboard" / file_stem(study)
        self.writer = SummaryWriter(str(self.dir))
        settings = "\n".join(f"    {k} = {v}" for k, v in flat(config).items())
        self.writer.add_text("run/definition", settings, 0)
        self.writer.flush()
        self.last = 0
        self.where = (
            f"{self.dir} (tensorboard --logdir {self.dir.parent} --samples_per_plugin text=0: "
            "without it TensorBoard shows 10 trials' records)"
        )

    def trial(self, rec: TrialRecord) -> None:
        w, n = self.writer, rec.number
        self.last = max(self.last, n)
        for k, v in rec.metrics.items():
            w.add_scalar(f"trial/{k}", v, n)
        params = " ".join(f"{k}={v}" for k, v in rec.flat_params().items())
        w.add_text("trial/record", f"trial {n}: {rec.line()} | {params}", n)
        hparams = {k: _hparam(v) for k, v in rec.flat_params().items()}
        hparams.update(state=rec.state, reason=rec.reason, baseline=rec.baseline)
        metrics = {f"hparam/{k}": v for k, v in rec.metrics.items() if k in TRIAL_METRICS}
        w.add_hparams(hparams, metrics, run_name=f"trial-{n}", global_step=n)
        w.flush()

    def result(self, res: RunResult) -> None:
        for k, v in res.metrics.items():
            self.writer.add_scalar(f"run/{k}", v, self.last)
        self.writer.add_text("run/result", res.line(), self.last)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


def flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``a.b`` keys; values a tracker takes as they are (numbers, text,
    booleans) kept, anything else (None, lists) as text."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, f"{key}."))
        else:
            out[key] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
    return out


def _hparam(v: Any) -> bool | int | float | str:
    return v if isinstance(v, (bool, int, float, str)) else str(v)


def _ms(when: Any) -> int | None:
    return None if when is None else int(when.timestamp() * 1000)


def _ms_now() -> int:
    import time

    return int(time.time() * 1000)


def _no_password(uri: str) -> str:
    """``uri`` without the password its network location may hold."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
