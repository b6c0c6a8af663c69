"""Token selection that makes speculative sampling exact *and* reproducible.

Greedy: ``argmax(logits)``.

Sampling uses the Gumbel-max trick with noise that depends only on
``(random_seed, request, position)``::

    token(position) = argmax(filter(logits / temperature) + G(seed, request, position))

where ``G`` is i.i.d. standard Gumbel noise over the vocabulary and ``filter`` applies
top-k then top-p (nucleus) by setting the removed logits to ``-inf``. ``argmax`` of
Gumbel-perturbed log-probabilities is an exact sample from the filtered, tempered softmax.

Why this matters for prompt lookup: a draft token is kept only when it equals the token
the target itself selects at that position, and on the first mismatch the target's own
token is used. Because the noise for a position is fixed by the seed, the token selected
at every position is the same whether that position was reached by plain decoding or by
verifying a draft. A speculative run therefore gives *exactly the same tokens* as a plain
run with the same seed and sampler (up to floating-point differences between a batched
and a single-token forward pass), and its output distribution is exactly the plain one.

Cost: one ``torch.rand(vocab)`` per selected position, drawn on the host (the stream is
fixed by the seed, so it is drawn by the CPU generator on every device) and copied to the
logits' device asynchronously, plus a sort of the vocabulary when top-p is active. Greedy
selection is one ``argmax``. :func:`select_tokens` reads nothing back to the host: its
result stays on the device until the step's single transfer
(:func:`~promptlookup.runtime.acceptance.fetch_step`).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .base import SamplingConfig
from .device import to_device

_MASK64 = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 63-bit hash of integers (splitmix64 steps), stable across processes."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & _MASK64
        h ^= h >> 29
    return h >> 1


def filter_logits(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Tempered logits with everything outside top-k / top-p set to ``-inf`` (rows independent)."""
    x = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Keep a token while the mass strictly before it is below top_p (always keeps the first).
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def target_distribution(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The exact distribution :func:`select_tokens` samples from (for tests and analysis)."""
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits, sampling), dim=-1)


def gumbel_noise(vocab_size: int, seed: int, request: int, position: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_mix(seed, request, position))
    u = torch.rand(vocab_size, generator=gen, dtype=torch.float64).clamp_(min=1e-300)
    return (-torch.log(-torch.log(u))).float()


def select_tokens(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    requests: Sequence[int],
    positions: Sequence[int],
) -> torch.Tensor:
    """Select one token per row of ``logits`` ``[rows, vocab]``: an int64 tensor ``[rows]``
    on the logits' device (no device-to-host transfer).

    ``requests[i]`` and ``positions[i]`` name row ``i``'s request and the position of the
    token being chosen; they key the random stream, so that the same (request, position)
    always sees the same noise.
    """
    if sampling.greedy:
        return logits.argmax(-1)
    x = filter_logits(logits, sampling)
    noise = torch.stack(
        [gumbel_noise(x.shape[-1], sampling.random_seed, r, p) for r, p in zip(requests, positions)]
    )
    return (x + to_device(noise, x.device)).argmax(-1)
