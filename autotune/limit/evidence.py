"""The first measurement: what bounds the defaults' step, and what each screening prior can
gain from it, before a trial is spent on the prior.

Right after the baseline trial, the limit probe (``autotune.rank.limit_probe``) runs once on the
defaults. Its record gives, per optimizer step of the slowest rank: data, forward, backward
(the bare model's), the communication DDP did not hide, the optimizer, the all-reduce of the
gradients alone and of its last bucket, and one all-reduce of each of a few message sizes.
``Evidence.from_probe`` turns that into:

* the **alpha-beta fit** of one all-reduce: ``seconds = alpha + bytes x per_byte`` (least
  squares over the message sizes; ring all-reduce costs about ``2(n-1) alpha_link +
  2(n-1)/n bytes / beta_link``, so ``alpha`` and ``per_byte`` hold both factors);
* the split of the gradients' all-reduce into latency (``buckets x alpha``) and bandwidth
  (the rest);
* **what bounds the step** (``bound``): ``data`` when loading takes at least
  ``DATA_BOUND_SHARE`` of it; else ``bandwidth`` or ``latency`` when the exposed
  communication takes at least ``COMM_BOUND_SHARE`` (bandwidth when the bytes' part of the
  all-reduce outweighs the messages' latency); else ``compute``.

``expected_gain`` gives each prior an **optimistic** speedup over the defaults from that
breakdown - an upper bound, so that a prior whose bound is within the noise can be skipped
safely:

* a compressing comm hook (fp16, bf16) halves the bytes: the step saves at most half of the
  bandwidth part, and never more than the exposed communication (a latency-bound all-reduce
  gains nothing);
* fewer, larger buckets save at most the latency of the messages they merge;
* smaller buckets can at most hide what sticks out beyond the backward (the ideal-overlap
  bound of ``autotune.limit.probe``);
* lower precision shrinks forward and backward at most ``PRECISION_SPEEDUP`` times (the
  communication the shorter backward no longer hides is added back);
* DataLoader workers take at most the whole data phase off the loop.

For advice rather than screening (``autotune.limit.probe.next_step``), compression is judged
on what *surely* depends on the bytes (``compressed_surely``: the all-reduce less its messages
at the smallest message's time, an upper bound on the latency that a noisy fit cannot talk
down), and not at all when the all-reduce is latency-dominated (``latency_dominated``).

Priors with no model (``static_graph``, gradients as bucket views) get ``None``: they are
screened after the modelled priors whose bound is beyond the noise, in their listed order.
Screening (``autotune.search.screening``) orders by these bounds and skips those within the noise;
``autotune.limit.probe.next_step`` names the next family from the same model. The record is the
study's user attribute ``first_measurement`` (taken once: a resumed or shared study reads it
back).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from autotune.core.knobs import HALF_HOOKS
from autotune.core.values import nbytes, number, seconds

__all__ = [
    "COMM_BOUND_SHARE",
    "DATA_BOUND_SHARE",
    "Evidence",
    "expected_gain",
    "fit_alpha_beta",
]

#: Exposed communication, as a share of the step, from which communication is the bottleneck.
COMM_BOUND_SHARE = 0.2
#: Data loading, as a share of the step, from which the data pipeline is.
DATA_BOUND_SHARE = 0.15
#: The most lower precision is assumed to speed up forward and backward (optimistic: bf16 on a
#: CPU with AVX512-BF16 measured 1.26-1.44x for a whole step; tensor cores do more).
PRECISION_SPEEDUP = {"cpu": 2.0, "cuda": 4.0}
#: DDP's default bucket size (MB) and the bucket sizes the priors move to.
DEFAULT_BUCKET_MB = 25.0


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> tuple[float, float] | None:
    """(alpha seconds, seconds per byte) of ``seconds = alpha + bytes x per_byte``, by least
    squares over at least two distinct sizes; both clamped at zero (a noisy fit cannot make a
    message cost less than nothing). None with fewer than two sizes."""
    pts = [(float(b), float(t)) for b, t in zip(sizes, seconds, strict=False)]
    if len({b for b, _ in pts}) < 2:
        return None
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    mt = sum(t for _, t in pts) / n
    var = sum((b - mb) ** 2 for b, _ in pts)
    slope = max(sum((b - mb) * (t - mt) for b, t in pts) / var, 0.0)
    alpha = max(mt - slope * mb, 0.0)
    if alpha == 0.0:  # refit the slope through the origin
        slope = max(sum(b * t for b, t in pts) / sum(b * b for b, _ in pts), 0.0)
    return alpha, slope


def _num(raw: dict[str, Any], key: str) -> float:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"first measurement: {key!r} is not a non-negative number ({v!r})")
    return float(v)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the defaults' step is spent on (seconds per optimizer step, slowest rank)."""

    step_s: float
    data_s: float
    forward_s: float
    backward_s: float
    """The bare model's backward (no all-reduce)."""
    optimizer_s: float
    exposed_s: float
    """Communication DDP did not hide behind the backward."""
    comm_s: float
    """The gradients' all-reduce alone, every bucket back to back."""
    last_bucket_s: float
    buckets: int
    grad_bytes: float
    """Bytes the defaults' all-reduce sends per step (fp32 gradients, no hook)."""
    alpha_s: float
    """Seconds of one all-reduce that do not depend on its size (latency), as fitted."""
    smallest_s: float
    """The smallest message's all-reduce: an upper bound on the latency (least squares,
    dominated by the largest message, can put alpha below it)."""
    per_byte_s: float
    world_size: int
    accumulation_steps: int
    device: str
    noise: float
    """The relative half-width of the baseline trial's 95 % interval (at least ``HELPS``)."""

    # -- derived -------------------------------------------------------------------------
    @property
    def latency_s(self) -> float:
        """The all-reduce's seconds that are per message: ``buckets x alpha``, at most all."""
        return min(self.buckets * self.alpha_s, self.comm_s)

    @property
    def bandwidth_s(self) -> float:
        return max(self.comm_s - self.latency_s, 0.0)

    @property
    def surely_bytes_s(self) -> float:
        """The all-reduce's seconds that surely depend on its bytes: all of it less its
        messages at the smallest message's time each (an upper bound on the latency, which a
        noisy fit cannot talk down)."""
        return max(self.comm_s - self.buckets * self.smallest_s, 0.0)

    @property
    def latency_dominated(self) -> bool:
        """The all-reduce's time is mostly per message (small buckets, alpha dominates): by the
        fit, or because the bytes' part that survives the latency's upper bound is the smaller
        one. Halving its bytes then gains little: no compression is advised."""
        if self.world_size < 2 or self.comm_s <= 0:
            return False
        upper = min(self.buckets * self.smallest_s, self.comm_s)
        return self.latency_s >= self.bandwidth_s or self.surely_bytes_s < upper

    @property
    def hidden_s(self) -> float:
        """Communication hidden behind the backward: at most the backward itself."""
        return min(max(max(self.comm_s, self.exposed_s) - self.exposed_s, 0.0), self.backward_s)

    @property
    def bound(self) -> str:
        """``data``, ``bandwidth``, ``latency`` or ``compute`` (module doc)."""
        if self.data_s >= DATA_BOUND_SHARE * self.step_s:
            return "data"
        if self.world_size > 1 and self.exposed_s >= COMM_BOUND_SHARE * self.step_s:
            return "bandwidth" if self.bandwidth_s >= self.latency_s else "latency"
        return "compute"

    def describe(self) -> str:
        """One line: what bounds the step, and the parts it is made of."""

        def pct(x: float) -> str:
            return f"{x / self.step_s:.0%}" if self.step_s > 0 else "?"

        comm = ""
        if self.world_size > 1:
            comm = (
                f"communication {pct(max(self.comm_s, self.exposed_s))} ({pct(self.exposed_s)} "
                f"exposed; all-reduce {nbytes(self.grad_bytes)} in {self.buckets} bucket(s), "
                f"latency {seconds(self.smallest_s)}, {_rate(self.per_byte_s)}), "
            )
        return (
            f"{self.bound}-bound: {comm}compute {pct(self.forward_s + self.backward_s)}, "
            f"data {pct(self.data_s)}, optimizer {pct(self.optimizer_s)} of a "
            f"{seconds(self.step_s)} step"
        )

    # -- the record ----------------------------------------------------------------------
    def to_attrs(self) -> dict[str, Any]:
        out = {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        out["bound"] = self.bound
        return out

    @classmethod
    def from_attrs(cls, raw: object) -> Evidence:
        """Read a stored record back, checking every field (a study may be someone else's);
        ``ValueError`` naming the field otherwise."""
        if not isinstance(raw, dict):
            raise ValueError("first measurement: not a mapping")
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in ("buckets", "world_size", "accumulation_steps"):
                v = raw.get(f.name)
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"first measurement: {f.name!r} is not a positive integer")
                kw[f.name] = v
            elif f.name == "device":
                v = raw.get("device")
                if v not in ("cpu", "cuda"):
                    raise ValueError("first measurement: 'device' is not cpu or cuda")
                kw["device"] = v
            else:
                kw[f.name] = _num(raw, f.name)
        if kw["step_s"] <= 0:
            raise ValueError("first measurement: 'step_s' is not positive")
        return cls(**kw)

    @classmethod
    def from_probe(cls, record: dict[str, Any], *, device: str, noise: float) -> Evidence:
        """From a limit probe's record of the defaults (``autotune.rank.limit_probe.probe``)."""
        ddp, compute, comm = record["ddp"], record["compute"], record["comm"]
        backward = min(compute["backward"], ddp["backward"])
        fit = fit_alpha_beta(comm.get("fit_bytes") or [], comm.get("fit_s") or [])
        buckets = max(int(comm.get("buckets") or 1), 1)
        grad_bytes = float(comm.get("wire_bytes") or 0.0)
        comm_s = float(comm["comm_s"])
        if fit is None:  # an older probe: the all-reduce alone, one size; all of it bandwidth
            alpha, per_byte = 0.0, (comm_s / grad_bytes if grad_bytes else 0.0)
            smallest = 0.0
        else:
            alpha, per_byte = fit
            sizes = list(zip(comm["fit_bytes"], comm["fit_s"], strict=False))
            smallest = float(min(sizes)[1])
        return cls(
            step_s=float(ddp["step"]),
            data_s=float(ddp["data"]),
            forward_s=float(ddp["forward"]),
            backward_s=float(backward),
            optimizer_s=float(ddp["optimizer"]),
            exposed_s=max(float(ddp["backward"]) - backward, 0.0),
            comm_s=comm_s,
            last_bucket_s=float(comm.get("last_bucket_s") or 0.0),
            buckets=buckets,
            grad_bytes=grad_bytes,
            alpha_s=alpha,
            smallest_s=max(smallest, alpha),
            per_byte_s=per_byte,
            world_size=int(record["world_size"]),
            accumulation_steps=max(int(record.get("accumulation_steps") or 1), 1),
            device=device,
            noise=noise,
        )

    # -- what a change can gain ----------------------------------------------------------
    def speedup_if_saved(self, saved_s: float) -> float:
        """The step's speedup if it saved ``saved_s`` seconds."""
        return self.step_s / max(self.step_s - max(saved_s, 0.0), 1e-12)

    def compressed(self) -> float:
        """A hook that halves the bytes (fp16, bf16)."""
        if self.world_size < 2:
            return 1.0
        return self.speedup_if_saved(min(self.exposed_s, self.bandwidth_s / 2))

    def compressed_surely(self) -> float:
        """The same, for advice rather than for screening: half of what surely depends on the
        bytes, and nothing on a latency-dominated all-reduce (``latency_dominated``)."""
        if self.world_size < 2 or self.latency_dominated:
            return 1.0
        return self.speedup_if_saved(min(self.exposed_s, self.surely_bytes_s / 2))

    def fewer_messages(self, bucket_mb: float) -> float:
        """Larger buckets: the latency of the messages they merge (at the smallest message's
        time each: optimistic)."""
        if self.world_size < 2:
            return 1.0
        merged = max(1, math.ceil(self.grad_bytes / (bucket_mb * 2**20)) + 1)  # + DDP's first
        saved = max(self.buckets - merged, 0) * self.smallest_s
        return self.speedup_if_saved(min(self.exposed_s, saved))

    def more_overlap(self, bucket_mb: float | None = None) -> float:
        """Smaller buckets: at most what sticks out beyond the overlappable backward. With
        ``bucket_mb``, nothing where buckets of that size hold the gradients the way the
        defaults' do (DDP's 1 MiB first bucket plus one of ``bucket_mb``: a few KB of gradients
        are one message whatever the cap)."""
        if self.world_size < 2:
            return 1.0
        if bucket_mb is not None and self.grad_bytes <= (1 + bucket_mb) * 2**20:
            return 1.0
        overlappable = self.backward_s / self.accumulation_steps
        floor = max(self.comm_s - overlappable, 0.0)
        return self.speedup_if_saved(self.exposed_s - floor)

    def faster_compute(self) -> float:
        """Lower precision: forward and backward ``PRECISION_SPEEDUP`` times faster at most;
        the communication the shorter backward no longer hides comes back."""
        f = PRECISION_SPEEDUP.get(self.device, 2.0)
        backward = self.backward_s / f
        saved = (self.forward_s + self.backward_s) * (1 - 1 / f)
        unhidden = max(self.hidden_s - backward, 0.0)
        return self.speedup_if_saved(saved - unhidden)

    def off_the_loop(self) -> float:
        """DataLoader workers: the data phase off the training loop at most."""
        return self.speedup_if_saved(self.data_s)

    # -- the step after a change ---------------------------------------------------------
    def after(self, moves: dict[str, Any]) -> Evidence:
        """The first measurement predicted on the defaults with ``moves`` applied (the lever a
        screening found), by the same optimistic model as ``expected_gain``, so that the
        remaining priors can be rated on top of it: ``self.step_s / self.after(m).step_s`` is
        ``expected_gain(m, self)`` for one compressing hook, lower precision or workers.

        * a compressing hook (fp16, bf16) halves the wire bytes: the all-reduce loses half its
          bandwidth part, and the step what that exposed;
        * lower precision shortens forward and backward; communication the shorter backward no
          longer hides is exposed;
        * workers take the data phase off the loop.

        Other moves (bucket sizes, unmodelled knobs) leave the step as measured."""
        ev = self
        if ev.world_size > 1 and moves.get("comm_hook") in HALF_HOOKS:
            saved = min(ev.exposed_s, ev.bandwidth_s / 2)
            ev = replace(
                ev,
                comm_s=ev.comm_s - ev.bandwidth_s / 2,
                grad_bytes=ev.grad_bytes / 2,
                exposed_s=ev.exposed_s - saved,
                step_s=ev.step_s - saved,
            )
        if moves.get("precision") in ("bf16", "fp16", "tf32"):
            f = PRECISION_SPEEDUP.get(ev.device, 2.0)
            saved = (ev.forward_s + ev.backward_s) * (1 - 1 / f)
            unhidden = max(ev.hidden_s - ev.backward_s / f, 0.0)
            ev = replace(
                ev,
                forward_s=ev.forward_s / f,
                backward_s=ev.backward_s / f,
                exposed_s=ev.exposed_s + unhidden,
                step_s=ev.step_s - max(saved - unhidden, 0.0),
            )
        if moves.get("num_workers"):
            ev = replace(ev, step_s=ev.step_s - ev.data_s, data_s=0.0)
        return ev


def expected_gain(moves: dict[str, Any], ev: Evidence) -> float | None:
    """The optimistic speedup of a screening prior's ``moves`` over the defaults, from the
    first measurement ``ev``; None where no model applies (module doc)."""
    if "comm_hook" in moves:
        return ev.compressed() if moves["comm_hook"] in HALF_HOOKS else None
    if "precision" in moves:
        return ev.faster_compute() if moves["precision"] in ("bf16", "fp16", "tf32") else None
    if "num_workers" in moves:
        return ev.off_the_loop()
    if "bucket_cap_mb" in moves:
        mb = float(moves["bucket_cap_mb"])
        return ev.fewer_messages(mb) if mb > DEFAULT_BUCKET_MB else ev.more_overlap(mb)
    return None


def _rate(per_byte: float) -> str:
    if per_byte <= 0:
        return "bandwidth not measured"
    gbit = 8 / per_byte / 1e9
    if gbit >= 1:
        return f"{number(gbit, 3)} Gbit/s per all-reduce"
    return f"{number(gbit * 1e3, 3)} Mbit/s per all-reduce"
