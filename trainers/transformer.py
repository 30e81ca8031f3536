"""Small GPT-style language model on synthetic token streams; reports tokens/s as well.

Pre-norm decoder blocks (causal self-attention and an MLP), learned positions, the output head
tied to the token embedding, next-token cross-entropy. The token streams follow a seeded
random walk over the vocabulary, so there is structure to learn and the loss falls.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from autotune.rank.workload import Workload


class TokenStreams(torch.utils.data.Dataset):
    """``length`` sequences of ``seq_len + 1`` tokens computed from their index; an item is
    (tokens[:-1], tokens[1:])."""

    def __init__(self, *, length: int, seq_len: int, vocab: int, seed: int) -> None:
        self.length, self.seq_len, self.vocab, self.seed = length, seq_len, vocab, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        steps = torch.randint(-3, 4, (self.seq_len + 1,), generator=g)
        start = torch.randint(0, self.vocab, (1,), generator=g)
        tokens = (start + steps.cumsum(0)) % self.vocab
        return tokens[:-1], tokens[1:]


class GPT(nn.Module):
    def __init__(self, *, vocab: int, seq_len: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        nn.init.normal_(self.tokens.weight, std=0.02)  # GPT-2's scale: logits start near 0
        self.positions = nn.Parameter(torch.zeros(seq_len, dim))
        block = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tokens(x) + self.positions[:t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.norm(h) @ self.tokens.weight.T  # the head shares the embedding


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def workload(
    *,
    vocab: int = 2048,
    seq_len: int = 64,
    dim: int = 128,
    heads: int = 4,
    layers: int = 2,
    global_batch: int = 32,
    samples: int = 1 << 16,
    lr: float = 1e-3,
    seed: int = 0,
) -> Workload:
    return Workload(
        model=lambda: GPT(vocab=vocab, seq_len=seq_len, dim=dim, heads=heads, layers=layers),
        dataset=TokenStreams(length=samples, seq_len=seq_len, vocab=vocab, seed=seed),
        loss=next_token_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
        global_batch=global_batch,
        tokens_per_sample=seq_len,
        description=f"GPT {layers} layers x {dim}, vocab {vocab}, {seq_len} tokens, "
        f"global batch {global_batch}",
    )
