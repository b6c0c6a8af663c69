"""Offline drafting statistics without a model (like llama.cpp's ``lookup-stats``).

A recorded token stream stands in for the model: at each step the drafter proposes from
the text so far, the longest prefix of the draft that equals the actual next tokens is
accepted, and the next actual token is added as the target's own ("bonus") token. This is
exactly what greedy verification would do if the model had produced this stream, so the
counts (steps, drafted, accepted) are those a real run would see, without the model cost.

The request is started with ``max_seq_len = len(tokens)``, so drafts are capped the way a
generation limited to this output length would cap them.

With ``max_candidates = G > 1`` each step verifies the token tree of ``candidates(G)``
(:mod:`.tree`), as the runtime's tree step would: the longest candidate prefix equal to
the actual next tokens is accepted (the first such candidate in priority order is the one
reported to ``record``), and ``drafted`` counts tree nodes.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Sequence

from ..errors import UserError
from .base import DraftConfig, DraftRates
from .drafter import NgramDrafter, make_drafter
from .tree import merge_candidates


@dataclass
class SimStats(DraftRates):
    """Counts from simulating one configuration over one or more sequences.

    Invariants: ``accepted <= drafted``; ``generated == sum of output lengths``;
    ``steps >= 1`` per non-empty output; each step yields ``accepted_in_step + 1`` tokens.
    """

    label: str = ""
    sequences: int = 0
    steps: int = 0  # verification steps (target forward passes)
    generated: int = 0  # output tokens
    drafted: int = 0  # draft tokens offered
    accepted: int = 0  # draft tokens kept
    proposals: int = 0  # steps with a non-empty draft
    draft_seconds: float = 0.0  # wall time spent in the drafter (informational)

    @property
    def generated_tokens(self) -> int:
        return self.generated

    @property
    def mean_draft_len(self) -> float:
        return self.drafted / self.proposals if self.proposals else 0.0

    @property
    def draft_us_per_step(self) -> float:
        return 1e6 * self.draft_seconds / self.steps if self.steps else 0.0

    def add(self, other: "SimStats") -> None:
        for name in ("sequences", "steps", "generated", "drafted", "accepted", "proposals", "draft_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            tokens_per_step=self.tokens_per_step,
            mean_draft_len=self.mean_draft_len,
            draft_us_per_step=self.draft_us_per_step,
        )
        return d


def config_label(config: DraftConfig) -> str:
    parts = [config.mode, f"k={config.prompt_lookup_num_tokens}"]
    if config.mode == "pool":
        parts.append(f"n={config.max_matching_ngram_size}")
    elif config.mode == "llamacpp":
        pass  # n-grams of 1..4 tokens, as llama.cpp
    else:
        parts.append(f"max_match={config.max_match_len}")
    if config.adaptive:
        parts.append("adaptive")
    if config.max_candidates > 1:
        parts.append(f"G={config.max_candidates}")
    return " ".join(parts)


def _run_one(drafter: NgramDrafter, tokens: Sequence[int], prompt_len: int) -> SimStats:
    tokens = [int(t) for t in tokens]
    if not 0 <= prompt_len <= len(tokens):
        raise UserError(f"prompt length {prompt_len} is outside the sequence (0..{len(tokens)} tokens)")
    stats = SimStats(sequences=1, generated=len(tokens) - prompt_len)
    clock = time.perf_counter
    spent = 0.0
    t0 = clock()
    req = drafter.new_request(tokens[:prompt_len], max_seq_len=len(tokens))
    spent += clock() - t0
    pos = prompt_len
    end = len(tokens)
    g = drafter.config.max_candidates
    while pos < end:
        t0 = clock()
        draft = req.propose()
        candidates = req.candidates(g) if g > 1 else [draft]
        spent += clock() - t0
        a = 0
        limit = len(draft)
        for candidate in candidates:  # the first candidate with the longest accepted prefix
            c = 0
            while c < len(candidate) and candidate[c] == tokens[pos + c]:
                c += 1
            if c > a:
                a, limit = c, len(candidate)
        nodes = len(merge_candidates(candidates)[0]) if g > 1 else len(draft)
        new = tokens[pos:pos + a + 1]
        t0 = clock()
        req.record(limit, a)
        req.extend(new)
        spent += clock() - t0
        pos += len(new)
        stats.steps += 1
        stats.drafted += nodes
        stats.accepted += a
        stats.proposals += 1 if nodes else 0
    t0 = clock()
    req.finish()
    stats.draft_seconds = spent + (clock() - t0)
    return stats


def simulate(
    tokens: Sequence[int],
    prompt_len: int,
    config: DraftConfig,
    *,
    drafter: NgramDrafter | None = None,
    tokenizer: Any = None,
) -> SimStats:
    """Simulate drafting over ``tokens`` whose first ``prompt_len`` tokens are the prompt.

    A fresh drafter is made from ``config`` unless ``drafter`` is given (pass one to carry
    the public pool and the dynamic cache from sequence to sequence).
    """
    drafter = drafter or make_drafter(config, tokenizer)
    stats = _run_one(drafter, tokens, prompt_len)
    stats.label = config_label(drafter.config)
    return stats


def simulate_corpus(
    sequences: Iterable[tuple[Sequence[int], int]], config: DraftConfig, *, tokenizer: Any = None
) -> SimStats:
    """Simulate ``(tokens, prompt_len)`` sequences in order with one drafter (shared pools)."""
    drafter = make_drafter(config, tokenizer)
    total = SimStats(label=config_label(config))
    for tokens, prompt_len in sequences:
        total.add(_run_one(drafter, tokens, prompt_len))
    return total


def config_grid(
    base: DraftConfig,
    ks: Sequence[int],
    ns: Sequence[int],
    modes: Sequence[str],
    adaptive: Sequence[bool] = (False,),
) -> list[DraftConfig]:
    """The product of the options (``n`` only varies for the pool mode), in a stable order."""
    out: list[DraftConfig] = []
    seen = set()
    for mode, k, n, ad in itertools.product(modes, ks, ns, adaptive):
        cfg = replace(
            base,
            mode=mode,
            prompt_lookup_num_tokens=k,
            max_matching_ngram_size=n if mode == "pool" else base.max_matching_ngram_size,
            adaptive=ad,
        )
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out
