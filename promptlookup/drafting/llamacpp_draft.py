"""llama.cpp's n-gram cache drafting (``llama_ngram_cache_draft``), for ``mode="llamacpp"``.

What is reproduced: ``llama_ngram_cache_draft`` in llama.cpp's ``common/ngram-cache.cpp``,
with the caches its ``lookup`` example passes (``examples/lookup/lookup.cpp``):

- the *context* cache counts the n-grams of 1..4 tokens (``LLAMA_NGRAM_MIN``..``MAX``) of the
  request's own text, updated as tokens are accepted;
- the *dynamic* cache (``--lookup-cache-dynamic``) holds the counts of earlier runs; at the
  end of a run the context cache is merged into it and it is saved;
- the *static* cache (``--lookup-cache-static``, built by ``llama-lookup-create``) is
  consulted with the last 2 tokens only (``LLAMA_NGRAM_STATIC``).

Each drafted token, with ``seq`` the text followed by the tokens drafted so far:

1. ``part_static``: the static cache's counts for the last 2 tokens of ``seq`` (none: empty).
2. Context cache, llama.cpp's *lax* thresholds, then dynamic cache, *strict* thresholds:
   for the n-grams ending ``seq`` from 4 tokens down to 1, the first one present whose
   counts pass the thresholds gives its best token. A candidate's weight is its count times
   ``100 * part_static[token]`` when the static cache saw it after these 2 tokens, else
   times 1 (the static cache re-weights the candidates); the best token has the largest
   weight. Thresholds for an n-gram of s tokens (index s - 1): the sum of its counts is at
   least ``min_sample_size[s-1]`` and the best token's count is at least
   ``min_percent[s-1]`` percent of that sum.
3. Static cache alone: the most frequent token after the last 2 tokens, if its counts pass
   the lax thresholds of a 2-gram (at least 2 observations, at least 50 %).
4. Nothing: the draft ends.

The draft is at most ``prompt_lookup_num_tokens`` tokens (llama.cpp's ``--draft``), and none
is made before the text has 2 tokens. Where this differs from llama.cpp, on purpose:

- ties in weight (or, in step 3, in count) go to the smallest token id; llama.cpp keeps
  whichever its ``std::unordered_map`` happens to iterate first, which is unspecified;
- an n-gram longer than the text is not looked up (llama.cpp would read before the start
  of its buffer).

Cost per drafted token: one dictionary lookup per n-gram size and cache, plus a walk over
the candidates of each n-gram found (the number of distinct tokens seen after it).
"""
from __future__ import annotations

from typing import Sequence

from .cache_file import LAX, STRICT, NgramCache

NGRAM_MIN = 1  # llama.cpp's LLAMA_NGRAM_MIN
NGRAM_MAX = 4  # llama.cpp's LLAMA_NGRAM_MAX
NGRAM_STATIC = 2  # llama.cpp's LLAMA_NGRAM_STATIC


def counts_of(cache: NgramCache | None, gram: Sequence[int]) -> dict[int, int] | None:
    """``cache``'s next-token counts for the n-gram ``gram`` (``None``: never seen)."""
    s = len(gram)
    if cache is None or s > cache.max_ngram:
        return None
    entry = cache.tables[s].get(gram[0] if s == 1 else tuple(gram))
    return None if entry is None else entry[3]


def _best(counts: dict[int, int], part_static: dict[int, int]) -> tuple[int, int, int]:
    """(best token, its count, sum of counts): largest count * static weight, ties to the smaller id."""
    best_token, best_count, best_weight, total = -1, 0, 0, 0
    for token, count in counts.items():
        weight = count * (100 * part_static[token] if token in part_static else 1)
        if weight > best_weight or (weight == best_weight and token < best_token):
            best_token, best_count, best_weight = token, count, weight
        total += count
    return best_token, best_count, total


def _from_primary(cache: NgramCache | None, seq: Sequence[int], part_static: dict[int, int], thresholds) -> int:
    if cache is None:
        return -1
    min_sizes, min_percents = thresholds
    for s in range(min(NGRAM_MAX, len(seq)), NGRAM_MIN - 1, -1):
        counts = counts_of(cache, seq[len(seq) - s:])
        if not counts:
            continue
        token, count, total = _best(counts, part_static)
        if total < min_sizes[s - 1] or 100 * count < min_percents[s - 1] * total:
            continue
        return token
    return -1


def _from_static(part_static: dict[int, int]) -> int:
    if not part_static:
        return -1
    token, count, total = _best(part_static, {})
    min_sizes, min_percents = LAX
    if total < min_sizes[NGRAM_STATIC - 1] or 100 * count < min_percents[NGRAM_STATIC - 1] * total:
        return -1
    return token


def llamacpp_draft(text: Sequence[int], n_draft: int, context: NgramCache | None,
                   dynamic: NgramCache | None, static: NgramCache | None) -> list[int]:
    """``llama_ngram_cache_draft`` for ``text``: up to ``n_draft`` tokens (see the module docstring)."""
    if len(text) < NGRAM_STATIC:
        return []
    seq = list(text[-NGRAM_MAX:])
    draft: list[int] = []
    while len(draft) < n_draft:
        part_static = counts_of(static, seq[-NGRAM_STATIC:]) or {}
        token = _from_primary(context, seq, part_static, LAX)
        if token < 0:
            token = _from_primary(dynamic, seq, part_static, STRICT)
        if token < 0:
            token = _from_static(part_static)
        if token < 0:
            break
        draft.append(token)
        seq.append(token)
    return draft
