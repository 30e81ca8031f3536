"""Values that failed every time they ran are not run again.

The sampler sees configuration failures as its worst observations
(``search.samplers.FailureAwareTPESampler``), yet a multivariate TPE over many knobs still
proposes a value that failed in one combination within others: on a CPU whose bf16 is
emulated, 13 of 160 trials of a 2-hour run combined ``precision=bf16`` with other knobs and
each spent its whole timeout.

The rule: a value away from the defaults (``knob=value``) is *known failing* once at least
``FAILS_TO_DROP`` trials with it failed for a reason about their configuration
(``FailureReason.learned``, less ``illegal``: a rule about a combination, nothing ran) and no
trial with it was ever measured (COMPLETE or PRUNED: it
runs, whatever its speed). A trial the sampler proposes with such a value is not run: it is
recorded FAIL ``known_failing`` at once, naming the value and the failures, so the sampler
moves further away; the run says so in one line the first time each value is dropped. The
trials autotune queues itself (the baseline, runs of the defaults, the screening, the
combination and its fold-over) always run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core.errors import FailureReason
from autotune.launch.failures import learned_reasons
from autotune.record import trial as tr

__all__ = ["FAILS_TO_DROP", "known_failing", "queued_by_design"]

#: Failures of a value, with no measured trial of it, before it is not run again.
FAILS_TO_DROP = 2


def queued_by_design(t: tr.AnyTrial) -> bool:
    """A trial autotune queued itself: the baseline, a run of the defaults, a screening,
    combination or fold-over trial."""
    return (
        tr.is_baseline(t)
        or tr.anchor(t) is not None
        or tr.screen_label(t) is not None
        or tr.combination(t) is not None
        or tr.fold(t) is not None
    )


def known_failing(
    study: optuna.Study, params: dict[str, Any], defaults: dict[str, Any]
) -> tuple[str, int, str] | None:
    """The first value of ``params`` away from ``defaults`` that is known failing (module
    doc): (``knob=value``, its failed trials, their reasons by count); None when none is."""
    moved = {k: v for k, v in params.items() if k in defaults and defaults[k] != v}
    if not moved:
        return None
    # a combination rule (illegal) never ran the value; not run (known_failing) proves nothing new
    learned = learned_reasons() - {FailureReason.KNOWN_FAILING.value, FailureReason.ILLEGAL.value}
    failed: dict[str, Counter[str]] = {k: Counter() for k in moved}
    ran: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        same = [k for k, v in moved.items() if k in t.params and t.params[k] == v]
        if not same:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            ran.update(same)
        elif t.state == TrialState.FAIL and tr.reason(t) in learned:
            for k in same:
                failed[k][tr.reason(t)] += 1
    for k, reasons in failed.items():
        n = sum(reasons.values())
        if k not in ran and n >= FAILS_TO_DROP:
            said = ", ".join(f"{r} x{c}" if c > 1 else r for r, c in reasons.most_common())
            return f"{k}={moved[k]}", n, said
    return None
