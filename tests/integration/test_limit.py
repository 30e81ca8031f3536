"""The limit probe in real 2-rank gloo DDP, each rank its own process (``torch.multiprocessing``,
no Ray: the probe is rank code): what it sends is the model's gradients in DDP's own buckets,
in the hook's dtype; the bare-model step really does not all-reduce; every rank returns the
same record; rank 0 writes a Chrome trace of real DDP steps. Timings are not asserted (the
arithmetic on them is tested in ``tests/unit/test_limit.py``)."""

from __future__ import annotations

import json
import socket

import pytest
import torch.multiprocessing as mp

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.rank_io import RankSpec
from autotune.rank.measure import run_rank
from autotune.rank.session import open_session

pytestmark = pytest.mark.integration

OPTIONS = {"width": 256, "layers": 4, "global_batch": 64}
#: Parameters of that MLP (``trainers/mlp.py``): 4 x Linear(256, 256) and a Linear(256, 16) head.
PARAMS = 4 * (256 * 256 + 256) + (256 * 16 + 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec(rank: int, port: int, *, hook: str, cap: float, limit: dict | None) -> RankSpec:
    config = TrialConfig(
        env={"OMP_NUM_THREADS": "1"},
        ddp={"bucket_cap_mb": cap},
        comm_hook={"name": hook},
        data={"num_workers": 0},
        micro_batch=32,
        accumulation_steps=1,
        global_batch=64,
        threads=1,
    )
    return RankSpec(
        trial=0,
        rank=rank,
        world_size=2,
        backend="gloo",
        master_addr="127.0.0.1",
        master_port=port,
        trainer="mlp",
        trainer_options=OPTIONS,
        config=config,
        measure=MeasureSettings(window_s=0.2),
        timeout_s=120,
        limit=limit,
    )


def _probe(rank: int, port: int, hook: str, cap: float, out: str) -> None:
    trace = f"{out}/trace.json"
    result = run_rank(spec(rank, port, hook=hook, cap=cap, limit={"repeats": 2, "trace": trace}))
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"limit": result.limit, "stop": result.stop, "windows": result.windows}, f)


def _bare_then_ddp(rank: int, port: int, out: str) -> None:
    """A DDP step, then a step of the bare model, then a DDP step again, each under the
    profiler: the collectives each issued."""
    from torch.profiler import profile

    counts = []
    with open_session(spec(rank, port, hook="none", cap=25.0, limit=None), None) as s:
        for communicate in (True, False, True):
            with profile() as prof:
                s.step(communicate=communicate)
            counts.append(sum(e.name == "gloo:all_reduce" for e in prof.events()))
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(counts, f)


@pytest.mark.parametrize(("hook", "cap", "width"), [("none", 100.0, 4), ("fp16", 0.1, 2)])
def test_the_probe_all_reduces_the_gradients_in_ddps_buckets(tmp_path, hook, cap, width):
    mp.spawn(_probe, args=(free_port(), hook, cap, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["limit"] == ranks[1]["limit"]  # the slowest rank's figures, on both
    limit = ranks[0]["limit"]
    assert ranks[0]["stop"] == "limit" and len(ranks[0]["windows"]) == limit["steps"] >= 8
    comm = limit["comm"]
    # every gradient once, 4 bytes each, or 2 in the fp16 hook's dtype
    assert comm["wire_bytes"] == PARAMS * width
    assert comm["dtype"] == ("float32" if hook == "none" else "float16")
    # 100 MB holds the whole model (0.3 MB) in one bucket; at 0.1 MB a layer is over the cap
    assert (comm["buckets"] == 1) == (cap == 100.0) and comm["buckets"] <= 5
    assert limit["world_size"] == 2 and limit["samples_per_step"] == 64
    for section in ("ddp", "compute"):
        assert set(limit[section]) == {"data", "forward", "backward", "optimizer", "step"}
        assert all(v > 0 for v in limit[section].values()), limit[section]
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"autotune.step0", "DistributedDataParallel.forward", "gloo:all_reduce"} <= names


def test_the_bare_step_reduces_nothing_and_the_ddp_step_does(tmp_path):
    mp.spawn(_bare_then_ddp, args=(free_port(), str(tmp_path)), nprocs=2)
    for r in (0, 1):
        ddp, bare, again = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert ddp >= 1 and again == ddp  # DDP all-reduced its bucket(s), after the bare step too
        assert bare == 0
