"""Penalties and bad words, applied per logit row with that row's own prefix.

Semantics follow TensorRT-LLM's kernels (``penaltyKernels.cu``, ``banBadWords.cu``):

- A token is *seen* when it occurs in the row's prefix: the whole sequence so far, prompt
  included (TensorRT-LLM counts the input tokens too), with ``n`` its number of
  occurrences.
- Repetition penalty ``r`` (neutral 1.0): a seen token's logit ``l`` becomes ``l / r`` if
  ``l >= 0`` else ``l * r`` (the same rule as Hugging Face's
  ``RepetitionPenaltyLogitsProcessor``).
- Presence penalty ``p`` (neutral 0.0): subtracted once from each seen token.
- Frequency penalty ``f`` (neutral 0.0): ``f * n`` subtracted from each seen token.
- Order: TensorRT-LLM divides by the temperature ``T`` first and then applies the
  penalties. :func:`promptlookup.runtime.sampling.select_tokens` divides by ``T`` later,
  so the additive penalties are scaled by ``T`` here (``(l - p*T) / T == l/T - p``); the
  repetition penalty is multiplicative and commutes with ``T``. Greedy decoding with
  ``temperature == 0`` uses ``T = 1``, as TensorRT-LLM's greedy (``top_k == 1``) at its
  default temperature 1.
- Logit bias (OpenAI's ``logit_bias``): ``bias[t]`` is added to token ``t``'s raw logit,
  before the temperature divides it (as vLLM's processor does), so ``-100`` all but bans a
  token and ``+100`` all but forces it, at any temperature.
- Minimum tokens (``min_tokens``, vLLM's and TensorRT-LLM's ``min_tokens``): while a row's
  prefix holds fewer than ``min_tokens`` output tokens (its length minus the prompt's),
  ``end_id`` and the ``stop_token_ids`` are banned in that row (vLLM's rule), so the
  sequence cannot end early. The count comes
  from the row's own prefix, so it is exact under speculation like the penalties.
- Bad words: a one-token bad word is never produced; for a longer one, its last token is
  banned (logit ``-inf``) whenever the prefix ends with its other tokens. (TensorRT-LLM
  skips token id 0 here; this module bans any id.)

Why per row: in a verification step, the row of a draft node scores the position after
that node. Its prefix is ``tokens`` plus the path of draft tokens to the node -- exactly the prefix plain decoding
would have there if the draft so far is accepted. So the processed logits, and hence the
selected tokens, equal plain decoding's: greedy output stays identical and sampling stays
exact.

Cost: ``O(rows * longest_prefix)`` to count tokens (one padded ``scatter_add``), plus
``O(rows * bad_words * longest_bad_word)`` Python comparisons; nothing when every setting
is neutral.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .base import SamplingConfig
from .tree import DraftTree


def token_counts(prefixes: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """``counts[i, t]``: occurrences of token ``t`` in ``prefixes[i]`` (int32, ``[rows, vocab]``)."""
    width = max((len(p) for p in prefixes), default=0)
    padded = torch.full((len(prefixes), max(width, 1)), vocab_size, dtype=torch.long)
    for i, p in enumerate(prefixes):
        if p:
            padded[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    padded = padded.clamp_(0, vocab_size).to(device)  # ids are validated upstream; clamp keeps scatter safe
    counts = torch.zeros(len(prefixes), vocab_size + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return counts[:, :vocab_size]


def banned_tokens(prefix: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """The tokens that would complete a bad word right after ``prefix``."""
    out = []
    for word in bad_words:
        head = len(word) - 1
        if head == 0 or (len(prefix) >= head and list(prefix[len(prefix) - head :]) == list(word[:head])):
            out.append(word[-1])
    return out


def apply_logits_processors(
    logits: torch.Tensor,
    prefixes: Sequence[Sequence[int]],
    params: SamplingConfig,
    prompt_lens: Sequence[int] | None = None,
    end_id: int | None = None,
) -> torch.Tensor:
    """Return ``logits`` ``[rows, vocab]`` with penalties, logit bias, ``min_tokens`` and bad
    words applied per row.

    ``prefixes[i]`` is row ``i``'s whole sequence so far (prompt, output, and the draft
    tokens before that row's position); ``prompt_lens[i]`` the length of its prompt (for
    ``min_tokens``, which also needs ``end_id``; without either, ``min_tokens`` bans
    nothing). Returns the input unchanged (same object) when ``params`` has no logits
    processors; otherwise a new float32 tensor.
    """
    if not params.has_logits_processors:
        return logits
    if len(prefixes) != logits.shape[0]:
        raise ValueError(f"{len(prefixes)} prefixes for {logits.shape[0]} logit rows")
    x = logits.float().clone()
    vocab = x.shape[-1]
    penalized = params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    if penalized:
        counts = token_counts(prefixes, vocab, x.device)
        seen = counts > 0
        if params.repetition_penalty != 1.0:
            r = params.repetition_penalty
            x = torch.where(seen, torch.where(x < 0, x * r, x / r), x)
        scale = params.temperature if params.temperature > 0 else 1.0
        if params.presence_penalty != 0.0:
            x = x - (params.presence_penalty * scale) * seen.float()
        if params.frequency_penalty != 0.0:
            x = x - (params.frequency_penalty * scale) * counts.float()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias if 0 <= t < vocab], dtype=torch.long, device=x.device)
        bias = torch.tensor([b for t, b in params.logit_bias if 0 <= t < vocab], dtype=x.dtype, device=x.device)
        x[:, ids] += bias  # token ids are distinct (one entry per token)
    ends = [t for t in (end_id, *params.stop_token_ids) if t is not None and 0 <= t < vocab]
    if params.min_tokens > 0 and prompt_lens is not None and ends:
        early = [i for i, (p, n) in enumerate(zip(prefixes, prompt_lens)) if len(p) - n < params.min_tokens]
        if early:
            rows = torch.tensor(early, device=x.device)
            x[rows[:, None], torch.tensor(ends, device=x.device)[None, :]] = float("-inf")
    if params.bad_words:
        rows, cols = [], []
        for i, prefix in enumerate(prefixes):
            for t in banned_tokens(prefix, params.bad_words):
                if 0 <= t < vocab:
                    rows.append(i)
                    cols.append(t)
        if rows:
            x[torch.tensor(rows, device=x.device), torch.tensor(cols, device=x.device)] = float("-inf")
    return x


def row_prefixes(sequences: Sequence[Sequence[int]], drafts: Sequence[Any]) -> list[list[int]]:
    """One prefix per verified position, in the row order of a verification step's logits:
    for sequence ``b``, ``sequences[b]`` (the root's row), then for each node of
    ``drafts[b]`` (a :class:`~.tree.DraftTree`, or a chain as a token list) the sequence plus
    the tokens on the path to that node, the node included."""
    out: list[list[int]] = []
    for s, d in zip(sequences, drafts):
        tree = d if isinstance(d, DraftTree) else DraftTree.chain(d)
        base = list(s)
        out.append(base)
        for j in range(len(tree)):
            out.append(base + [tree.tokens[a] for a in tree.path_to(j)])
    return out