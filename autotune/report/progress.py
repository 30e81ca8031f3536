"""What ``autotune run`` shows while it runs, and the table it ends with.

``RunView`` subscribes to the run's events (``autotune.core.events``): pass it as ``emit`` to
``tuner.run``. On a terminal: a live rich display under the log lines (the budget as a
progress bar, trials complete / failed / pruned, the best speedup so far, each running
trial's settings). With ``--quiet``, or when the output is not a terminal (a log file, CI),
the same events are plain lines, one per trial, no colour and no redraws. Either way the run
ends with a summary table.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from autotune.core import events as ev
from autotune.core.knobs import changed_knobs
from autotune.core.stats import precise, speedup_text
from autotune.core.values import number, speedup, terminal_safe
from autotune.definition.durations import format_duration
from autotune.record import trial as tr
from autotune.record.study import baseline_trial, complete, failure_reasons
from autotune.search.screening import verdict

__all__ = ["RunView", "changed_settings", "failure_line", "format_changes", "summary_table"]


class _Live(Progress):
    """A progress bar for the budget with two status lines under it."""

    def __init__(self, view: RunView) -> None:
        self.view = view
        self.task: Any = None  # rich renders once inside __init__, before the task exists
        super().__init__(
            TextColumn("[bold]budget"),
            BarColumn(),
            TextColumn("{task.fields[spent]} of {task.fields[budget]}"),
            console=view.console,
            refresh_per_second=2,
            transient=True,
        )
        self.task = self.add_task("budget", total=view.budget_s, spent="0s", budget="")

    def get_renderables(self) -> Any:
        v = self.view
        if self.task is None:
            return
        spent = 0.0 if v.started is None else min(time.monotonic() - v.started, v.budget_s)
        self.update(
            self.task,
            completed=spent,
            spent=format_duration(spent),
            budget=format_duration(v.budget_s),
        )
        yield Group(self.make_tasks_table(self.tasks), *v.status_lines())


class RunView:
    """The run's display: ``log`` lines always, the live part only on a terminal."""

    def __init__(self, console: Console, *, budget_s: float, live: bool | None = None) -> None:
        self.console = console
        self.budget_s = budget_s
        self.live = console.is_terminal if live is None else live
        self.started: float | None = None  # when the budget began (the first trial)
        self.counts: Counter[str] = Counter()
        self.best: tuple[float, int] | None = None  # (speedup, trial)
        self.running: dict[str, str] = {}  # tag -> settings of each trial in flight
        self._progress: _Live | None = None
        self._lock = threading.Lock()  # events come from every trial's thread

    def __enter__(self) -> RunView:
        if self.live:
            self._progress = _Live(self)
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def status(self) -> RenderableType:
        """The live part as it stands now (the budget bar and the status lines under it), as
        the terminal shows it: for a picture of the display (``docs/screenshots.py``)."""
        return Group(*_Live(self).get_renderables())

    def log(self, text: str) -> None:
        """A line of the run's log (rich markup allowed; stripped off a plain console)."""
        self.console.print(terminal_safe(text), highlight=False, soft_wrap=True)

    def __call__(self, event: Any) -> None:
        """Show one event of the run (``autotune.core.events``); called from any thread. A
        line holding a control character (from a study, a database, a command) is shown
        escaped (``terminal_safe``), unstyled. The live part is redrawn at once: a trial
        shorter than the refresh period is still shown running."""
        with self._lock:
            for line in self._render(event):
                if not line.plain.isprintable():
                    line = Text(terminal_safe(line.plain))
                self.console.print(line, highlight=False, soft_wrap=True)
            if self._progress is not None:
                self._progress.refresh()

    def _render(self, e: Any) -> list[Text]:
        """Update the live state from ``e``; the log lines it makes (plain text, styled)."""
        if isinstance(e, ev.Note):
            return [Text(e.text)]
        if isinstance(e, ev.BudgetStarted):
            self.budget_started(e.spent_s)
            return []
        if isinstance(e, ev.TrialStarted):
            self.trial_started(e.tag, format_changes(e.changes))
            return []
        if isinstance(e, ev.TrialFinished):
            speedup = None if e.outcome == ev.Outcome.FAILED else e.speedup
            self.trial_finished(str(e.outcome), speedup, e.number, e.tag)
            return [_trial_line(e)]
        if isinstance(e, ev.StudyOpened):
            return _study_lines(e)
        if isinstance(e, ev.ScreeningDone):
            return _screening_lines(e)
        if isinstance(e, ev.ValidationStarted):
            return [
                Text(
                    f"Re-validating {', '.join(e.candidates)} against the baseline: "
                    f"{e.rounds} interleaved rounds ({e.runs} runs)"
                )
            ]
        if isinstance(e, ev.ValidationRun):
            self.running.pop(f"re-validating {e.key}", None)
            if e.failure is not None:
                return [Text.assemble(f"  {e.key:>10} ", ("FAIL", "red"), f" {e.failure}")]
            pm = 100 * (e.rel_half_width or 0.0)
            return [Text(f"  {e.key:>10} {number(e.throughput):>9} samples/s ±{pm:.1f}%")]
        if isinstance(e, ev.ValidationDone):
            self.running.clear()
            if e.winner is None:
                return [Text(e.reason)]
            if e.beats_baseline and e.speedup is not None:
                if precise(e.speedup):
                    said = f"{e.winner} is {speedup_text(e.speedup)} the defaults"
                else:
                    said = f"{e.winner} over the defaults: {speedup_text(e.speedup)}"
                return [Text(f"Validated: {said}")]
            return [Text(f"Validated: {e.reason}")]
        return []

    def budget_started(self, spent_s: float = 0.0) -> None:
        self.started = time.monotonic() - spent_s

    def trial_started(self, tag: str, settings: str) -> None:
        self.running[tag] = settings

    def trial_finished(
        self, state: str, speedup: float | None, trial: int, tag: str | None = None
    ) -> None:
        """``state`` is complete, failed or pruned; ``tag`` the finished trial's, as given to
        ``trial_started`` (None: every trial shown as running is done)."""
        if tag is None:
            self.running.clear()
        else:
            self.running.pop(tag, None)
        self.counts[state] += 1
        better = self.best is None or (speedup or 0.0) > self.best[0]
        if state == "complete" and speedup is not None and better:
            self.best = (speedup, trial)

    def status_lines(self) -> list[RenderableType]:
        c = self.counts
        best = (
            "" if self.best is None else f" · best {speedup(self.best[0])} (trial {self.best[1]})"
        )
        lines: list[RenderableType] = [
            Text(
                f"trials {c['complete']} complete · {c['failed']} failed · "
                f"{c['pruned']} pruned{best}"
            )
        ]
        for tag, settings in list(self.running.items()):
            lines.append(Text(f"running {tag}: {settings}", style="dim", overflow="ellipsis"))
        return lines


def _study_lines(e: ev.StudyOpened) -> list[Text]:
    if e.created:
        lines = [Text.assemble("New study ", (e.name, "bold"))]
    else:
        lines = [Text.assemble("Resuming study ", (e.name, "bold"), f" ({e.trials} trials so far)")]
    lines.append(Text(f"Searching {len(e.dimensions)} dimensions: {', '.join(e.dimensions)}"))
    if e.left_out:
        lines.append(Text("Left out on this backend/device (no trial is spent on a no-op):"))
        lines.extend(Text(f"  - {item}") for item in e.left_out)
    if e.closed:
        lines.append(
            Text(
                f"Closed {len(e.closed)} trial(s) left RUNNING by a driver that died: "
                f"{', '.join(map(str, e.closed))} (FAIL, reason interrupted)"
            )
        )
    return lines


def _screening_lines(e: ev.ScreeningDone) -> list[Text]:
    """Each screened knob's effect (alone, or on top of the lever: ``+ bucket_cap_mb=5``, its
    speedup over the defaults and its gain over the lever), best first, and what is combined
    next."""
    lines = [Text("Screening: each knob moved alone from the defaults, or on top of the lever")]
    ranked = sorted(e.effects, key=lambda x: -(x["speedup"] or 0.0))
    for x in ranked:
        label = x["label"] if not x.get("on_top") else f"+ {x['label']}"
        if x["speedup"] is None:
            lines.append(Text(f"  {label:<30} {x['state'].lower()}", style="dim"))
            continue
        ci = x.get("interval") or {}
        pm = 100 * ci.get("rel_half_width", 0.0) if isinstance(ci, dict) else 0.0
        said = verdict(x)
        if x.get("on_top") and x.get("gain") is not None:
            said = f"{said}: {speedup(x['gain'])} on top of {x['on_top']}"
        mark = (said, "green" if said.startswith("helps") else "yellow" if x["helps"] else "dim")
        lines.append(Text.assemble(f"  {label:<30} {x['speedup']:5.2f}x ±{pm:.1f}%  ", mark))
    if e.combined:
        lines.append(Text(f"Next: the helpful knobs combined ({', '.join(e.combined)})"))
    return lines


def _trial_line(e: ev.TrialFinished) -> Text:
    """``[1m05s]   trial 3     512 samples/s  1.21x ±2.1% 4w  static_graph=True`` (54,350
    samples/s for a fast one: ``autotune.core.values.number``)."""
    shown = format_changes(e.changes)
    head = f"[{format_duration(e.elapsed_s)}] {e.tag:>9} "
    if e.outcome == ev.Outcome.FAILED:
        return Text.assemble(head, ("FAIL", "red"), f" {e.reason}: {e.detail}  ", (shown, "dim"))
    speedup = "  -  " if e.speedup is None else f"{e.speedup:5.2f}"
    pruned = ("PRUNED ", "yellow") if e.outcome == ev.Outcome.PRUNED else ""
    pm = 100 * (e.rel_half_width or 0.0)
    return Text.assemble(
        head,
        (f"{number(e.throughput):>9}", "green"),
        f" samples/s {speedup}x ",
        pruned,
        f"±{pm:.1f}% {e.windows}w  ",
        (shown, "dim"),
    )


def summary_table(study: Any, *, top: int = 5) -> Table:
    """The baseline and the best ``top`` COMPLETE trials: throughput, speedup, what changed."""
    from optuna.trial import TrialState

    base = baseline_trial(study)
    done = complete(study)
    reference = None if base is None else base.params
    multi = len(study.directions) > 1
    front = {t.number for t in study.best_trials} if multi else set()
    ranked = sorted(done, key=lambda t: -t.values[0])[:top]
    if multi:  # the whole Pareto front, fastest first
        ranked = sorted(study.best_trials, key=lambda t: -t.values[0])
    if base is not None and base.state == TrialState.COMPLETE and base not in ranked:
        ranked.append(base)
    title = (
        f"Pareto front of {len(done)} complete trials (samples/s up, peak memory down)"
        if multi
        else f"Best of {len(done)} complete trials"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("trial", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("speedup", justify="right")
    if multi:
        table.add_column("peak MiB/rank", justify="right")
    table.add_column("settings that differ from the defaults")
    for t in ranked:
        is_base = base is not None and t.number == base.number
        tag = " (baseline)" if is_base else ""
        if multi and is_base and t.number not in front:
            tag = " (baseline, dominated)"
        memory = [number(t.values[1])] if multi else []
        table.add_row(
            f"{t.number}{tag}",
            number(t.values[0]),
            speedup(_speedup(t)),
            *memory,
            # a Text, escaped: a stored setting is not rich markup, and holds no escape
            Text(terminal_safe(changed_settings(t.params, reference))),
        )
    return table


def failure_line(study: Any) -> str | None:
    """``failed: 3 timeout, 1 crash`` or None when nothing failed."""
    reasons = failure_reasons(study)
    if not reasons:
        return None
    return "Failed     " + ", ".join(f"{n} {r}" for r, n in reasons.most_common())


def changed_settings(params: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """The settings of ``params`` that differ from ``reference`` (``knobs.changed_knobs``;
    None: all of them) as ``k=v`` words, or ``defaults``."""
    return format_changes(params if reference is None else changed_knobs(params, reference))


def format_changes(changes: dict[str, Any]) -> str:
    """``k=v`` words for changed settings, or ``defaults`` when there are none."""
    return " ".join(f"{k}={_short(v)}" for k, v in changes.items()) or "defaults"


def _short(v: Any) -> str:
    return number(v) if isinstance(v, float) else str(v)


def _speedup(t: Any) -> float:
    v = tr.speedup(t)
    return float("nan") if v is None else v
