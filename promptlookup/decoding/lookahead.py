"""Lookahead decoding (Fu, Bailis, Stoica, Zhang, ICML 2024): drafts from a Jacobi window.

No draft model and no reliance on the prompt: the target itself, run over a 2-D window
of guessed tokens, produces n-grams; a pool keeps them; a verification branch checks the
pool's n-grams that start with the sequence's last token. Both branches are nodes of one
token tree (:class:`~promptlookup.runtime.tree.DraftTree`), verified in one forward pass.

Configuration (TensorRT-LLM's ``LookaheadDecodingConfig`` / ``--lookahead_config "[W,N,G]"``):
``W`` window columns, ``N`` n-gram size, ``G`` verification set size (n-grams kept per key
and checked per step).

State per request
    - The window: ``N - 1`` *levels* of guessed tokens. Level ``l``, column ``i`` stands for
      the token ``1 + i + l`` positions after the root (the sequence's last token).
    - The pool: per key token, at most ``G`` continuations of ``N - 1`` tokens, in
      least-recently-used order (a re-inserted n-gram becomes the most recent; the oldest
      is evicted past ``G``).

The tree of one step
    - Level-0 tokens form a chain hanging from the root; the level-``l`` token of column
      ``i`` has the level-``l - 1`` token of column ``i`` as its parent. So a level-``l``
      token in column ``i`` sees the root, level-0 columns ``0..i`` and column ``i`` of
      levels ``1..l``: the paper's mask. Window nodes are never accepted.
    - Each pool candidate keyed by the root's token is a chain hanging from the root; the
      candidates are merged into one prefix tree (a shared prefix is verified once), so
      each sees only the root and its own earlier tokens.

After the step
    - Column ``i``'s tokens from level 0 up, plus the target's choice at its top token,
      form an ``N``-gram; its first token is the key and the rest enter the pool: ``W``
      n-grams per step.
    - The window moves forward one position: every level takes the next level's tokens and
      the top level takes the target's choices at the old top level (Jacobi iteration).
      In the reference code's layout, where the root is column 0 of level 0, this is the
      shift by one column.
    - The loop accepts the longest verified candidate plus the target's own next token; the
      bonus token is emitted even when a candidate matches in full.
    - Warm-up: the window starts as level 0 only, ``W + N - 2`` tokens copied from the
      prompt (seeded, reproducible); each of the first ``N - 2`` steps computes the next
      level from the top one and verifies nothing, dropping one column so that positions
      stay aligned, which leaves ``N - 1`` levels of ``W`` columns.

Combined with prompt lookup, the pool is also seeded with the prompt's n-grams and every
accepted token's n-gram (as TensorRT-LLM does), so the verification branch offers copies
from the input as well; the n-gram drafter's own draft joins the tree as one more branch.

Greedy output is unchanged: acceptance follows the target's own choices along the tree.
Cost per step: O(W * N + G * N) Python work, and the forward pass over
:func:`step_tokens` tree nodes.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from ..defaults import DEFAULT_LOOKAHEAD
from ..errors import UserError
from ..literals import parse_list_literal
from ..runtime.tree import DraftTree, merge_chains

WINDOW, PROMPT, LOOKUP = "window", "prompt", "lookup"  # where a candidate came from


@dataclass(frozen=True)
class LookaheadConfig:
    """``[W, N, G]``, with TensorRT-LLM's ``LookaheadDecodingConfig`` field names."""

    max_window_size: int = DEFAULT_LOOKAHEAD[0]  # W
    max_ngram_size: int = DEFAULT_LOOKAHEAD[1]  # N
    max_verification_set_size: int = DEFAULT_LOOKAHEAD[2]  # G

    def __post_init__(self) -> None:
        w, n, g = self.max_window_size, self.max_ngram_size, self.max_verification_set_size
        fix = 'pass --lookahead_config "[W,N,G]" with W >= 1, N >= 2, G >= 0, e.g. "[4,3,4]"'
        for name, v, low in (("W (max_window_size)", w, 1), ("N (max_ngram_size)", n, 2),
                             ("G (max_verification_set_size)", g, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise UserError(f"lookahead {name} must be an integer >= {low}, got {v!r}; {fix}")

    @property
    def triple(self) -> tuple[int, int, int]:
        return self.max_window_size, self.max_ngram_size, self.max_verification_set_size


def step_tokens(config: LookaheadConfig, extra: int = 0) -> int:
    """The most tree nodes one step of this project's Lookahead feeds (``extra``: nodes of
    a prompt-lookup branch beside it). The engine needs ``max_draft_len`` at least this.

    After warm-up a step has ``(N - 1) * W`` window nodes and at most ``G * (N - 1)``
    candidate nodes; warm-up step ``f`` (``f`` levels filled) has ``f * (W + N - 1 - f)``.
    """
    w, n, g = config.triple
    warm = max((f * (w + n - 1 - f) for f in range(1, n - 1)), default=0)
    return max(warm, (n - 1) * w + g * (n - 1) + extra)


def trtllm_draft_len(config: LookaheadConfig) -> int:
    """TensorRT-LLM's rule for ``max_draft_len``: ``(N - 2) + (W - 1 + G) * (N - 1)``."""
    w, n, g = config.triple
    return (n - 2) + (w - 1 + g) * (n - 1)


def parse_lookahead_config(text: str) -> LookaheadConfig:
    """Parse ``"[W, N, G]"`` (TensorRT-LLM's ``--lookahead_config``); bad input is one line."""
    hint = 'expected "[W,N,G]", e.g. "[4,3,4]"'
    value = parse_list_literal(text, "--lookahead_config", hint, items=3)
    return LookaheadConfig(*value)


class LookaheadPool:
    """Per key token, at most ``capacity`` continuations in LRU order, each with a source label."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.table: dict[int, OrderedDict[tuple[int, ...], str]] = {}

    def add(self, key: int, continuation: Sequence[int], source: str) -> None:
        if self.capacity <= 0:
            return
        entries = self.table.setdefault(key, OrderedDict())
        tup = tuple(continuation)
        entries.pop(tup, None)
        entries[tup] = source
        if len(entries) > self.capacity:
            entries.popitem(last=False)

    def add_ngrams(self, tokens: Sequence[int], n: int, source: str) -> None:
        """Insert every ``n``-gram of ``tokens`` in order (later ones most recent)."""
        for s in range(len(tokens) - n + 1):
            self.add(tokens[s], tokens[s + 1 : s + n], source)

    def candidates(self, key: int) -> list[tuple[tuple[int, ...], str]]:
        """Continuations of ``key``, most recent first."""
        entries = self.table.get(key)
        return list(reversed(entries.items())) if entries else []


class LookaheadRequest:
    """One request's window and pool (see the module docstring)."""

    def __init__(self, config: LookaheadConfig, prompt: Sequence[int], *, seed: int = 0,
                 seed_pool_from_text: bool = False) -> None:
        self.config = config
        w, n, g = config.triple
        self.n = n
        rng = random.Random(seed)
        self.levels: list[list[int]] = [[rng.choice(list(prompt)) for _ in range(w + n - 2)]]
        self.pool = LookaheadPool(g)
        self.seed_pool = seed_pool_from_text
        self.tokens = list(prompt)
        if seed_pool_from_text:
            self.pool.add_ngrams(self.tokens, n, PROMPT)
        self.window_nodes: list[list[int]] = []  # node index per (level, column) in the last tree

    @property
    def warming_up(self) -> bool:
        return len(self.levels) < self.n - 1

    def window_tree(self) -> tuple[list[int], list[int]]:
        """The window's nodes (tokens, parents), level by level; remembers their indices."""
        tokens: list[int] = []
        parents: list[int] = []
        self.window_nodes = []
        for level, row in enumerate(self.levels):
            ids = []
            for i, t in enumerate(row):
                if level == 0:
                    parent = ids[i - 1] if i else -1
                else:
                    parent = self.window_nodes[level - 1][i]
                ids.append(len(tokens))
                tokens.append(t)
                parents.append(parent)
            self.window_nodes.append(ids)
        return tokens, parents

    def candidates(self, root: int, limit: int) -> list[tuple[list[int], str]]:
        """Up to ``limit`` (continuation, source) pairs from the pool for ``root``, most
        recent first (none while warming up)."""
        if self.warming_up or limit <= 0:
            return []
        return [(list(c), src) for c, src in self.pool.candidates(root)[:limit]]

    def build_tree(self, branches: Sequence[tuple[list[int], str]], *, window: bool) -> DraftTree:
        """The step's tree: the window (when ``window``), then ``branches`` ((chain, source)
        pairs hanging from the root: pool candidates, a prompt-lookup draft) merged as one
        prefix tree."""
        merged = merge_chains([c for c, _ in branches], [src for _, src in branches])
        if window:
            wt, wp = self.window_tree()
        else:
            wt, wp, self.window_nodes = [], [], []
        off = len(wt)
        tokens = wt + merged.tokens
        parents = wp + [p + off if p >= 0 else -1 for p in merged.parents]
        walkable = [False] * off + [True] * len(merged)
        labels = [WINDOW] * off + list(merged.sources or [])
        return DraftTree(tokens, parents, walkable, labels)

    def observe(self, choices: Sequence[int], produced: Sequence[int]) -> None:
        """Update the window and the pool after a step (``choices`` as returned by the
        runtime for the tree last built; ``produced``: the tokens the step appended)."""
        if self.window_nodes and choices:
            top = [choices[1 + j] for j in self.window_nodes[-1]]
            if self.warming_up:
                self.levels.append(top)
                self.levels = [row[1:] for row in self.levels]
            else:
                for i, new in enumerate(top):
                    column = [row[i] for row in self.levels] + [new]
                    self.pool.add(column[0], column[1:], WINDOW)
                self.levels = self.levels[1:] + [top]
        self.window_nodes = []
        for t in produced:
            self.tokens.append(t)
            if self.seed_pool and len(self.tokens) >= self.n:
                self.pool.add(self.tokens[-self.n], self.tokens[-self.n + 1 :], PROMPT)
