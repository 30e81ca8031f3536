"""The built-in trainers honour the workload contract, give every rank the same data, and
learn (their loss falls), at sizes small enough for a unit test."""

from __future__ import annotations

import pytest
import torch

from autotune.core.errors import ConfigError
from autotune.rank.workload import Workload, available_trainers, load_workload

SMALL = {
    "mlp": {"width": 32, "layers": 2, "global_batch": 16},
    "convnet": {"size": 16, "width": 8, "decode_passes": 2, "global_batch": 16},
    "transformer": {"vocab": 64, "seq_len": 16, "dim": 32, "heads": 2, "global_batch": 16},
}


def test_every_builtin_trainer_is_listed_with_one_line():
    listed = available_trainers()
    assert set(SMALL) <= set(listed)
    for name, line in listed.items():
        assert line and "\n" not in line, name


def batch(wl: Workload, start: int, n: int = 8):
    items = [wl.dataset[i] for i in range(start, start + n)]
    return torch.utils.data.default_collate(items)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_builtin_trainer_learns_from_the_same_data_on_every_rank(name):
    torch.manual_seed(0)
    wl = load_workload(name, SMALL[name])
    a, b = batch(wl, 100), batch(load_workload(name, SMALL[name]), 100)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # same index, same item
    assert not torch.equal(batch(wl, 0)[0], batch(wl, 8)[0])
    model = wl.model()
    opt = wl.optimizer(model.parameters())
    x, y = batch(wl, 0)
    losses = []
    for _ in range(15):
        loss = wl.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], losses


def test_the_language_model_declares_its_tokens_per_sample():
    wl = load_workload("transformer", SMALL["transformer"])
    x, y = batch(wl, 0)
    assert wl.tokens_per_sample == 16 == x.shape[1] == y.shape[1]
    assert torch.equal(x[:, 1:], y[:, :-1])  # the targets are the next tokens
    assert load_workload("mlp").tokens_per_sample is None


def test_the_convnet_dataset_does_cpu_work_per_sample():
    wl = load_workload("convnet", {"size": 16, "decode_passes": 2})
    img, label = wl.dataset[3]
    assert img.shape == (3, 16, 16) and img.dtype == torch.float32 and 0 <= label < 10


def test_a_bad_tokens_per_sample_is_refused(monkeypatch, tmp_path):
    (tmp_path / "badtokens.py").write_text(
        "import torch\nfrom autotune.rank.workload import Workload\n"
        "def wl(**o):\n"
        "    return Workload(model=lambda: torch.nn.Linear(2, 2), dataset=[(0, 0)],\n"
        "                    loss=lambda a, b: a, optimizer=lambda p: None, global_batch=2,\n"
        "                    tokens_per_sample=0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"tokens_per_sample must be a positive integer"):
        load_workload("badtokens:wl")
