"""The designed start: screen the high-prior knobs one at a time, then combine the helpful ones.

Random start-up trials change every knob at once, so 8 of them say little about any one knob;
on the workloads measured here a few switches carry nearly all of the gain. The search
therefore starts (after the baseline) with:

1. **screening** - one trial per prior in ``PRIORS`` that applies to the target and that the
   space contains: every knob at its default except that one (with the children it switches
   on at their defaults, or as the prior says). With a first measurement of the defaults
   (``autotune.limit.evidence``), the priors are screened in order of their expected gain, and a
   prior whose optimistic gain is within the baseline's noise is skipped (``plan``; the run
   says which and why). Without one (script mode, or the probe failed) they are screened in
   the order listed, each with its reason;
   **After a lever, its partners.** Once a screening trial beats the defaults' runs by
   ``LEVER`` or more (at 500 Mbit, the fp16 hook: 1.6-1.8x), the priors not yet screened are
   screened *on top of it*: a partner's gain often shows only once the lever took the
   bottleneck away (5 MB buckets: 1.00x alone, 1.03x on top of the hook). The partners
   **stack** (``Stack``): each is screened on top of the lever and every partner that helped
   before it, and rated against the trial it was stacked on (user attributes ``on_top``, the
   stack in words, and ``base``, that trial's number), so the lever's best combination is
   built one measured step at a time instead of waiting for the combination after the
   screening. On the recorded 1 Gbit landscape the best points move three knobs (the hook,
   bf16, 5 MB buckets or bucket views); screened each on the hook alone, they met only in the
   combination, after a run of the defaults. With a first measurement the partners are
   ordered and skipped by their gain on the step predicted after the stack
   (``Evidence.after``), but for smaller buckets on top of a compressing hook, which come
   first (``smaller_buckets_first``: the hook's per-bucket cast is work the first measurement
   never saw, and smaller buckets pipeline it). A prior that moves one of the lever's knobs is
   an alternative to it, still screened alone; priors screened before the lever was found are
   not screened again on top of it. Each such trial is itself a candidate;
2. **the defaults again** (a re-anchoring run, ``record.study.enqueue_anchor``): each effect
   is measured against the median of the defaults' runs before and after the screening, so
   that neither a cold first baseline nor drift decides what helps;
3. **the combination** - once those trials have ended, one trial that moves every knob whose
   screening trial beat the defaults by more than ``HELPS`` (the better value where two
   priors move the same knob), when at least two helped;
4. **the fold-over** - the combination with each of its knobs left out in turn (user
   attribute ``fold``: the label left out), one trial each, when it combines three or more
   (with two, leaving one out is a screening trial already measured). On the recorded default
   landscape the best points are the combination's neighbours, not its single knobs: with
   the fold-over, TPE's median share of the oracle over 100 replayed seeds of 15 trials went
   from 0.896 to 0.912 and its 10th percentile from 0.825 to 0.861 (``bench/replay.py``);
5. then the sampler (TPE by default) over the whole space; every screening result is in the
   study, so the model starts from them (TPE's start-up count is met by then).

The trials are queued with Optuna's ``enqueue_trial``, one at a time (``Screening.step``),
each marked with user attribute ``screen`` (the prior's label), ``anchor``, ``combination``
or ``fold``; their results are summarised on the study (user attribute ``screening``)
when the combination is queued. A resumed study goes on where the screening stopped and is
summarised once.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core.events import ScreeningDone
from autotune.core.knobs import HALF_HOOKS
from autotune.core.target import Target
from autotune.definition.distributions import contains
from autotune.definition.space import ResolvedSpace
from autotune.limit.evidence import DEFAULT_BUCKET_MB, Evidence, expected_gain
from autotune.record import trial as tr
from autotune.record.attrs import ScreenEffect, load_screening, save_screening
from autotune.record.study import anchors, enqueue_anchor, throughput
from autotune.record.typed import write

__all__ = ["HELPS", "PRIORS", "Planned", "Prior", "Screening", "applicable", "plan", "ruled_out"]
__all__ += ["LEVER", "Stack", "gain", "on_top", "smaller_buckets_first", "verdict"]

#: The ``anchor`` attribute of the run of the defaults that closes the screening.
AGAIN = "after screening"
#: A screened knob helps when its trial's throughput is above the baseline's by this fraction.
HELPS = 0.02
#: A screening trial this many times faster than the defaults' runs is the lever: the priors
#: after it are screened on top of it (module doc).
LEVER = 1.2


def _always(t: Target) -> bool:
    return True


def _ours(t: optuna.trial.FrozenTrial) -> bool:
    """A trial the screening queued."""
    return (
        tr.screen_label(t) is not None
        or tr.combination(t) is not None
        or tr.fold(t) is not None
        or tr.anchor(t) == AGAIN
    )


@dataclass(frozen=True, kw_only=True)
class Prior:
    """A move from the defaults that often helps, why, and where it applies."""

    label: str
    moves: dict[str, Any]
    reason: str
    when: Callable[[Target], bool] = field(default=_always)
    compute_only: bool = False
    """Screened only where a first measurement says compute bounds the step (``plan``)."""


PRIORS: tuple[Prior, ...] = (
    Prior(
        label="precision=bf16",
        moves={"precision": "bf16"},
        when=lambda t: t.bf16 and t.bf16_native,
        reason="bf16 autocast runs matmuls on tensor cores (or a CPU's AVX512-BF16/AMX units) and "
        "halves activation memory. Not screened on CPUs without them: there it ran about 20x "
        "slower than fp32",
    ),
    Prior(
        label="precision=tf32",
        moves={"precision": "tf32"},
        when=lambda t: t.device == "cuda" and t.tf32,
        reason="fp32 matmuls on TF32 tensor cores, numerics close to fp32",
    ),
    Prior(
        label="compile=default",
        moves={"compile": "default"},
        when=lambda t: t.compile_problem is None,
        compute_only=True,
        reason="torch.compile fuses the forward's and backward's kernels; its compile time is in "
        "every such trial's warm-up, so only a compute-bound step is worth it",
    ),
    Prior(
        label="comm_hook=bf16",
        moves={"comm_hook": "bf16"},
        when=lambda t: t.backend == "nccl",
        reason="halves the bytes every all-reduce moves; wins when communication is the bottleneck",
    ),
    Prior(
        label="static_graph=True",
        moves={"static_graph": True},
        reason="DDP skips per-step graph bookkeeping and fixes the bucket order after the first "
        "step",
    ),
    Prior(
        label="gradient_as_bucket_view=True",
        moves={"gradient_as_bucket_view": True},
        reason="gradients live in the all-reduce buckets: one copy per step saved",
    ),
    Prior(
        label="num_workers",
        moves={"num_workers": 2, "persistent_workers": True},
        when=lambda t: t.device != "cuda",
        reason="batches are produced in worker processes, off the training loop",
    ),
    Prior(
        label="num_workers+pin_memory",
        moves={"num_workers": 4, "persistent_workers": True, "pin_memory": True},
        when=lambda t: t.device == "cuda",
        reason="batches produced off the training loop and copied from pinned memory",
    ),
    Prior(
        label="bucket_cap_mb=100",
        moves={"bucket_cap_mb": 100.0},
        reason="fewer, larger all-reduces: less per-call latency (gloo, small models)",
    ),
    Prior(
        label="bucket_cap_mb=5",
        moves={"bucket_cap_mb": 5.0},
        reason="smaller buckets start the all-reduce earlier in backward: more overlap",
    ),
    Prior(
        label="comm_hook=fp16",
        moves={"comm_hook": "fp16"},
        reason="halves the bytes every all-reduce moves; wins on slow links, costs a cast",
    ),
)


def applicable(space: ResolvedSpace) -> list[tuple[Prior, dict[str, Any]]]:
    """The priors that apply to ``space``'s target and that its dimensions contain, each
    with the params of its screening trial."""
    out = []
    for prior in PRIORS:
        if not prior.when(space.target):
            continue
        params = moved(space, prior.moves)
        if params is not None and params != space.baseline_params():
            out.append((prior, params))
    return out


#: Where an unmodelled prior (no expected gain) ranks among the modelled ones: about what
#: ``static_graph`` and bucket views measured alone on the recorded landscapes (1.01-1.07x).
UNMODELLED = 1.05


@dataclass(frozen=True)
class Planned:
    """A screening prior with its trial's params and its expected (optimistic) gain; None:
    no model applies, or nothing was measured first."""

    prior: Prior
    params: dict[str, Any]
    gain: float | None
    on_top: Prior | None = None
    """The lever it is screened on top of (its ``gain`` is then over the lever's step)."""


def plan(space: ResolvedSpace, evidence: Evidence | None) -> tuple[list[Planned], list[Planned]]:
    """(the priors to screen, in order; the priors skipped). Without ``evidence``, every
    applicable prior in the listed order. With it, by expected gain, highest first
    (``UNMODELLED`` standing in where no model applies), and those whose optimistic gain is
    within the baseline's noise (``evidence.noise``, at least ``HELPS``) skipped. A
    ``compute_only`` prior (compile) needs the evidence of a compute-bound step: without
    evidence it is left out, on any other bound it is skipped (its gain taken as 1)."""
    todo = [Planned(p, params, None) for p, params in applicable(space)]
    if evidence is None:
        return [t for t in todo if not t.prior.compute_only], []
    bar = 1 + max(evidence.noise, HELPS)
    rated = [Planned(t.prior, t.params, gain(t.prior, evidence)) for t in todo]
    keep = [t for t in rated if t.gain is None or t.gain > bar]
    skip = [t for t in rated if t.gain is not None and t.gain <= bar]
    keep.sort(key=lambda t: -(UNMODELLED if t.gain is None else t.gain))  # stable: listed order
    return keep, skip


@dataclass(frozen=True)
class Stack:
    """The lever and the partners stacked on it: each screened on top of the ones before it
    and faster than the trial it was stacked on by more than ``HELPS``."""

    labels: tuple[str, ...]
    """The lever's label, then each stacked partner's."""
    moves: dict[str, Any]
    """Their moves, a later one's value winning where two move the same knob."""
    trial: int
    """The number of the top trial: the one the next partner is rated against."""

    def __str__(self) -> str:
        return " + ".join(self.labels)


def on_top(
    space: ResolvedSpace,
    evidence: Evidence | None,
    lever: Prior,
    done: set[str],
    stack: Stack | None = None,
) -> list[Planned]:
    """The priors not in ``done`` to screen once ``lever`` is found, in order: its partners
    (priors that move none of its knobs) on top of ``stack`` (the lever alone by default),
    planned on the step predicted after the stack (``Evidence.after``: rated, ordered and
    skipped by what they add to it), then its alternatives (priors that move one of its
    knobs) alone, as ``plan`` had them."""
    stack = stack or Stack((lever.label,), dict(lever.moves), -1)
    after = None if evidence is None else evidence.after(stack.moves)
    planned = plan(space, after)[0]
    if after is not None and stack.moves.get("comm_hook") in HALF_HOOKS:
        planned = smaller_buckets_first(space, planned)
    partners = []
    for t in planned:
        if t.prior.label in done or set(t.prior.moves) & set(lever.moves):
            continue
        params = moved(space, {**stack.moves, **t.prior.moves})
        if params is not None:
            partners.append(Planned(t.prior, params, t.gain, on_top=lever))
    alternatives = [
        t
        for t in plan(space, evidence)[0]
        if t.prior.label not in done and set(t.prior.moves) & set(lever.moves)
    ]
    return partners + alternatives


def smaller_buckets_first(space: ResolvedSpace, planned: list[Planned]) -> list[Planned]:
    """``planned`` (partners rated on the step predicted after a compressing hook) with the
    priors that make buckets smaller than DDP's default first, unmodelled (gain None). A
    compressing hook casts every bucket before its all-reduce and copies it back after: work
    the first measurement, taken without the hook, never saw, and that smaller buckets
    pipeline behind the other buckets' transfers. The model's bound on smaller buckets leaves
    it out: on the lab's recorded 300 Mbit landscape it rated 5 MB buckets at most 1.001x on
    top of the fp16 hook; they measured 1.035x there (and 1.03x at 500 Mbit)."""
    smaller = [
        Planned(prior, params, None)
        for prior, params in applicable(space)
        if float(prior.moves.get("bucket_cap_mb", DEFAULT_BUCKET_MB)) < DEFAULT_BUCKET_MB
    ]
    first = {t.prior.label for t in smaller}
    return smaller + [t for t in planned if t.prior.label not in first]


#: The most torch.compile is assumed to speed up forward and backward (optimistic: its
#: published training speedups are mostly well below 2x).
COMPILE_SPEEDUP = 2.0


def gain(prior: Prior, ev: Evidence) -> float | None:
    """``prior``'s optimistic gain on ``ev``'s step (``limit.evidence.expected_gain``); a
    ``compute_only`` prior's is 1 unless compute bounds the step. Compile's model is lower
    precision's: forward and backward ``COMPILE_SPEEDUP`` times faster, less the communication
    the shorter backward no longer hides."""
    if prior.compute_only and ev.bound != "compute":
        return 1.0
    if "compile" not in prior.moves:
        return expected_gain(prior.moves, ev)
    saved = (ev.forward_s + ev.backward_s) * (1 - 1 / COMPILE_SPEEDUP)
    unhidden = max(ev.hidden_s - ev.backward_s / COMPILE_SPEEDUP, 0.0)
    return ev.speedup_if_saved(saved - unhidden)


def ruled_out(study: optuna.Study) -> frozenset[str]:
    """The knob names whose screening trial the run measured as no gain (completed, not
    ``helps``): the limit line does not name their family as the next step."""
    out: set[str] = set()
    for s in (load_screening(study) or {}).values():
        if not s.helps and s.state in ("COMPLETE", "PRUNED"):
            out.update(s.moves)
    return frozenset(out)


def verdict(effect: dict[str, Any]) -> str:
    """What a screening effect says, in words: ``helps`` only when the gain is beyond the
    trial's own noise (its speedup at the low end of its 95 % interval still above 1; the
    defaults' runs have noise too, so even that is optimistic); ``may help (within its
    noise)`` when it cleared ``HELPS`` but not that - it is still combined, the combination
    and the re-validation decide; else below or no gain. A prior screened on top of a lever
    is judged by its ``gain`` over the lever's trial. ``effect``: a ``_summary`` entry or
    ``export.screening_effects``' (``noise``: the interval's relative half-width)."""
    speedup = effect.get("speedup")
    if not isinstance(speedup, (int, float)) or isinstance(speedup, bool):
        return str(effect.get("state", "not measured")).lower()
    if effect.get("on_top"):  # judged against the lever's trial
        speedup = effect.get("gain")
        if not isinstance(speedup, (int, float)) or isinstance(speedup, bool):
            return "not measured against its lever"
    noise = effect.get("noise")
    interval = effect.get("interval")
    if noise is None and isinstance(interval, dict):
        noise = interval.get("rel_half_width")
    if not isinstance(noise, (int, float)) or isinstance(noise, bool):
        noise = 0.0
    if effect.get("helps") is True:
        return "helps" if speedup * (1 - noise) > 1 else "may help (within its noise)"
    if effect.get("state") == "PRUNED":
        return "clearly below the defaults (pruned)"
    return "no gain beyond the noise"


def _combine(summary: dict[str, ScreenEffect]) -> tuple[list[ScreenEffect], dict[str, Any]]:
    """The screened priors that helped and still move the combination, and its moves. Two
    values of one knob (bf16 and tf32) combine into the better one alone."""
    helped = [s for s in summary.values() if s.helps and s.speedup is not None]
    moves: dict[str, Any] = {}
    for s in sorted(helped, key=lambda s: s.speedup or 0.0):  # the better value last
        moves.update(s.moves)
    kept = [s for s in helped if all(moves[k] == v for k, v in s.moves.items())]
    return kept, moves


def moved(space: ResolvedSpace, moves: dict[str, Any]) -> dict[str, Any] | None:
    """The baseline's params with ``moves`` applied (children switched on by a move at their
    defaults unless moved too); None when the space cannot express it."""
    values = space.defaults()
    dims = space.distributions
    for name, value in moves.items():
        if name in dims and contains(dims[name], value):
            values[name] = value
        elif values[name] != value and name == next(iter(moves)):
            return None  # the prior's main move is not in this space
    params = {n: values[n] for n in space.active(values)}
    if any(n in dims and not contains(dims[n], v) for n, v in params.items()):
        return None
    return params


class Screening:
    """Queues the screening, the defaults again and the combination on ``study``, one trial
    at a time, so that a run stopped by its budget leaves at most one of them WAITING (a
    resumed run takes it first and goes on where this one stopped). ``step`` is called before
    the sampler's first trial and after each trial that another trial follows, from whichever
    thread ended it (under a lock)."""

    def __init__(self, study: optuna.Study, space: ResolvedSpace) -> None:
        self.study, self.space = study, space
        self._lock = threading.Lock()
        #: The first measurement (``Search`` sets it once the probe after the baseline ran).
        self.evidence: Evidence | None = None
        #: Set by ``Search`` when the budget holds the combination but not the run of the
        #: defaults before it (``claim_partners``): the screening closes without that run.
        self.hurry = False

    def claim_partners(self) -> bool:
        """Close the screening without its run of the defaults (``hurry``) when the helpers'
        combination is due: every planned prior screened and ended, two or more helped, and
        neither that run nor the combination queued yet - the trial worth running before the
        search stops (a lever's partners measured together). True for the one caller that
        set it (threads ask at once)."""
        with self._lock:
            if self.hurry or not self.is_open():
                return False
            trials = self.study.get_trials(deepcopy=False)
            ours = [t for t in trials if _ours(t)]
            if any(tr.anchor(t) == AGAIN for t in ours):  # queued, running or done: it stays
                return False
            screened = [t for t in ours if tr.screen_label(t) is not None]
            if self.untried() or not screened or any(not t.state.is_finished() for t in screened):
                return False
            kept, moves = _combine(self._summary(trials, screened))
            params = moved(self.space, moves) if len(kept) >= 2 else None
            self.hurry = params is not None and params not in [t.params for t in trials]
            return self.hurry

    def is_open(self) -> bool:
        """Whether the screening is still going on (its effects not summarised yet)."""
        return load_screening(self.study) is None

    def untried(self) -> list[Planned]:
        """The planned priors not screened yet (none once the screening is summarised)."""
        if not self.is_open():
            return []
        trials = self.study.get_trials(deepcopy=False)
        return self._todo(trials, [t for t in trials if t.state != TrialState.WAITING])[0]

    def _lever_trial(
        self, trials: list[optuna.trial.FrozenTrial]
    ) -> tuple[optuna.trial.FrozenTrial, Prior] | None:
        """The lever's screening trial and prior: the prior whose screening trial (moved
        alone, COMPLETE) beats the median of the defaults' runs so far by ``LEVER`` or more,
        the fastest such; None before one did."""
        runs = [throughput(t) for t in anchors(self.study)]
        if not runs:
            return None
        bar = LEVER * statistics.median(runs)
        best: tuple[float, optuna.trial.FrozenTrial, Prior] | None = None
        for t in trials:
            label = tr.screen_label(t)
            value = tr.measured(t, "throughput")
            if label not in BY_LABEL or tr.on_top(t) or t.state != TrialState.COMPLETE:
                continue
            if value and value >= bar and (best is None or value > best[0]):
                best = (value, t, BY_LABEL[label])
        return None if best is None else best[1:]

    def stack(self, trials: list[optuna.trial.FrozenTrial]) -> Stack | None:
        """The lever and the partners stacked on it so far (``Stack``); None before a lever.
        A partner joins when its trial, rated against the top of the stack it was queued on,
        helps (``HELPS``); one queued on an older top (trials run at once) does not."""
        found = self._lever_trial(trials)
        if found is None:
            return None
        top, lever = found
        labels, moves = [lever.label], dict(lever.moves)
        for t in sorted(trials, key=lambda t: t.number):
            label = tr.screen_label(t)
            if label not in BY_LABEL or tr.on_top(t) is None or t.state != TrialState.COMPLETE:
                continue
            if _base_number(t, top) != top.number or not _helps_over(t, top):
                continue
            replaced = set(BY_LABEL[label].moves)  # a partner moving a stacked one's knobs
            labels = [x for x in labels if not set(BY_LABEL[x].moves) <= replaced] + [label]
            moves.update(BY_LABEL[label].moves)
            top = t
        return Stack(tuple(labels), moves, top.number)

    def _todo(
        self, trials: list[optuna.trial.FrozenTrial], counted: list[optuna.trial.FrozenTrial]
    ) -> tuple[list[Planned], Stack | None]:
        """The planned priors that no trial of ``counted`` screened, in the order they are
        screened: as ``plan`` has them until a lever is found, then ``on_top`` of its stack;
        with that stack (None before a lever)."""
        done = {label for t in counted if (label := tr.screen_label(t)) is not None}
        stack = self.stack(trials)
        if stack is None:
            planned = plan(self.space, self.evidence)[0]
            return [t for t in planned if t.prior.label not in done], None
        lever = BY_LABEL[stack.labels[0]]
        return on_top(self.space, self.evidence, lever, done, stack), stack

    def step(self) -> ScreeningDone | None:
        """Queue what comes next unless one of ours is queued already: the next prior not yet
        screened; then the defaults again; then, once those ended, record the effects on the
        study (user attribute ``screening``), queue the combination and return what to say."""
        with self._lock:
            trials = self.study.get_trials(deepcopy=False)
            ours = [t for t in trials if _ours(t)]
            if any(t.state == TrialState.WAITING for t in ours):
                return None
            summary = load_screening(self.study)
            if summary is not None:  # screened (in this run or an earlier one)
                self._fold_over(trials, summary)
                return None
            todo, stack = self._todo(trials, ours)
            if todo:
                marks: dict[str, Any] = {"screen": todo[0].prior.label}
                if todo[0].gain is not None:
                    marks["expected_gain"] = round(todo[0].gain, 4)
                if todo[0].on_top is not None and stack is not None:
                    marks.update(on_top=str(stack), base=stack.trial)
                tr.enqueue(self.study, todo[0].params, **marks)
                return None
            screened = [t for t in ours if tr.screen_label(t) is not None]
            again = [t for t in ours if tr.anchor(t) == AGAIN]
            if screened and not again and not self.hurry:  # effects against both runs
                enqueue_anchor(self.study, self.space, AGAIN)
                return None
            if any(not t.state.is_finished() for t in screened + again):
                return None  # a concurrent trial of ours is still running
            summary = self._summary(trials, screened)
            save_screening(self.study, summary)
            kept, moves = _combine(summary)
            params = moved(self.space, moves) if len(kept) >= 2 else None
            if params in [t.params for t in trials]:
                params = None  # a lever and one partner: screened together already
            labels: list[str] = []
            if params is not None:  # else nothing to combine: the sampler takes over
                labels = [s.label for s in kept]
                tr.enqueue(self.study, params, combination=labels)
            return ScreeningDone(effects=[write(e) for e in summary.values()], combined=labels)

    def _fold_over(
        self, trials: list[optuna.trial.FrozenTrial], summary: dict[str, ScreenEffect]
    ) -> None:
        """Queue the next fold-over trial, if any: the combination with one of its knobs left
        out, unless a trial of the study already ran those params."""
        if not any(tr.combination(t) is not None for t in trials):
            return
        kept, moves = _combine(summary)
        if len(kept) < 3:
            return
        done = {tr.fold(t) for t in trials}
        seen = [t.params for t in trials]
        for s in kept:
            if s.label in done:
                continue
            rest = {k: v for k, v in moves.items() if k not in s.moves}
            params = moved(self.space, rest) if set(rest) <= set(self.space.defaults()) else None
            if params is not None and params not in seen:
                tr.enqueue(self.study, params, fold=s.label)
                return

    def _summary(
        self, trials: list[optuna.trial.FrozenTrial], screened: list[optuna.trial.FrozenTrial]
    ) -> dict[str, ScreenEffect]:
        """Each screened prior: its trial, state, speedup over the baseline and whether it
        helps (on top of a lever: its gain over the trial it was stacked on)."""
        # the defaults as measured before and after the screening trials
        runs = [throughput(t) for t in anchors(self.study)]
        base_value = statistics.median(runs) if runs else None
        found = self._lever_trial(trials)
        by_number = {t.number: t for t in screened}
        out: dict[str, ScreenEffect] = {}
        for t in screened:
            label = tr.screen_label(t) or ""
            speedup = None  # a PRUNED trial's too: its windows' median, clearly below
            measured = tr.measured(t, "throughput")
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and base_value and measured:
                speedup = measured / base_value
            stacked_on = tr.on_top(t)
            gain = None  # on top of a lever: over the trial it was stacked on
            if stacked_on is not None and speedup is not None and found is not None:
                base = by_number.get(_base_number(t, found[0]))
                below = None if base is None else tr.measured(base, "throughput")
                gain = measured / below if below and measured else None
            over = speedup if stacked_on is None else gain
            prior = BY_LABEL.get(label)
            out[label] = ScreenEffect(
                label=label,
                trial=t.number,
                state=t.state.name,
                speedup=None if speedup is None else round(speedup, 4),
                interval=tr.interval_record(t),
                helps=t.state == TrialState.COMPLETE and over is not None and over > 1 + HELPS,
                moves={} if prior is None else dict(prior.moves),
                reason="" if prior is None else prior.reason,
                on_top=stacked_on,
                gain=None if gain is None else round(gain, 4),
            )
        return out


#: The screening's priors by label.
BY_LABEL = {p.label: p for p in PRIORS}


def _base_number(t: optuna.trial.FrozenTrial, lever: optuna.trial.FrozenTrial) -> int:
    """The number of the trial ``t`` (on top of a lever) is rated against: its ``base``, or
    the lever's trial for a trial queued before ``base`` was recorded."""
    base = tr.on_top_of(t)
    return lever.number if base is None else base


def _helps_over(t: optuna.trial.FrozenTrial, below: optuna.trial.FrozenTrial) -> bool:
    """Whether ``t`` measured faster than ``below`` by more than ``HELPS``."""
    value, under = tr.measured(t, "throughput"), tr.measured(below, "throughput")
    return bool(value and under and value > (1 + HELPS) * under)
