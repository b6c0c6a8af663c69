"""Test drafters that are right some of the time and wrong the rest.

All follow the :class:`promptlookup.drafting.base.Drafter` protocol. Their randomness is
their own (``random.Random`` seeded per request), never the sampler's, so a draft never
sees the noise of the positions it proposes.
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

from promptlookup.drafting.base import DraftConfig, Drafter


class _Request:
    """Shared per-request bookkeeping: the prompt and the tokens generated so far."""

    def __init__(self, prompt: Sequence[int], max_seq_len: int, rng: random.Random) -> None:
        self.prompt = tuple(prompt)
        self.generated: list[int] = []
        self.max_seq_len = max_seq_len
        self.rng = rng

    def room(self, k: int) -> int:
        return max(0, min(k, self.max_seq_len - 1 - len(self.prompt) - len(self.generated)))

    def extend(self, tokens: Sequence[int]) -> None:
        self.generated.extend(tokens)

    def record(self, drafted: int, accepted: int) -> None:
        pass

    def finish(self) -> None:
        pass


class _ChainRequest(_Request):
    def __init__(self, prompt, max_seq_len, rng, chains: Mapping[tuple, Mapping[tuple, int]], k, vocab, wrong):
        super().__init__(prompt, max_seq_len, rng)
        self.chain = chains.get(self.prompt, {})
        self.k, self.vocab, self.wrong = k, vocab, wrong

    def propose(self) -> list[int]:
        ctx = tuple(self.generated)
        draft: list[int] = []
        while len(draft) < self.room(self.k) and ctx in self.chain:
            t = self.chain[ctx]
            if self.rng.random() < self.wrong:
                t = self.rng.randrange(self.vocab)
            draft.append(t)
            ctx += (t,)
        return draft


class ArgmaxChainDrafter:
    """Proposes the model's own argmax continuation (looked up in a precomputed table),
    replacing each token by a uniformly random one with probability ``wrong``.

    ``chains[prompt][generated_so_far]`` is the model's argmax next token. Under sampling
    the argmax is the likeliest single token, so these drafts are often, not always, kept:
    exactly the drafts that a greedy acceptance rule would wrongly favour.
    """

    def __init__(self, chains: Mapping[tuple, Mapping[tuple, int]], k: int, vocab: int, wrong: float, seed: int) -> None:
        self.config = DraftConfig(prompt_lookup_num_tokens=k)
        self.chains, self.k, self.vocab, self.wrong = chains, k, vocab, wrong
        self.rng = random.Random(seed)

    def new_request(self, prompt: Sequence[int], max_seq_len: int) -> _ChainRequest:
        rng = random.Random(self.rng.getrandbits(64))
        return _ChainRequest(prompt, max_seq_len, rng, self.chains, self.k, self.vocab, self.wrong)


class _RandomRequest(_Request):
    def __init__(self, prompt, max_seq_len, rng, k, vocab):
        super().__init__(prompt, max_seq_len, rng)
        self.k, self.vocab = k, vocab

    def propose(self) -> list[int]:
        n = self.rng.randrange(self.room(self.k) + 1)
        return [self.rng.randrange(self.vocab) for _ in range(n)]


class RandomDrafter:
    """Proposes 0..k uniformly random tokens (right only by chance)."""

    def __init__(self, k: int, vocab: int, seed: int) -> None:
        self.config = DraftConfig(prompt_lookup_num_tokens=k)
        self.k, self.vocab = k, vocab
        self.rng = random.Random(seed)

    def new_request(self, prompt: Sequence[int], max_seq_len: int) -> _RandomRequest:
        return _RandomRequest(prompt, max_seq_len, random.Random(self.rng.getrandbits(64)), self.k, self.vocab)


class _ReplayRequest(_Request):
    def __init__(self, prompt, max_seq_len, rng, reference, k, vocab, wrong):
        super().__init__(prompt, max_seq_len, rng)
        self.reference, self.k, self.vocab, self.wrong = list(reference), k, vocab, wrong

    def propose(self) -> list[int]:
        g = len(self.generated)
        if self.generated != self.reference[:g]:
            return []
        draft = self.reference[g : g + self.room(self.k)]
        return [self.rng.randrange(self.vocab) if self.rng.random() < self.wrong else t for t in draft]


class ReplayDrafter:
    """Proposes the continuation of a reference output (request ``i`` replays
    ``references[i]``), each token corrupted with probability ``wrong``: long runs of
    accepted drafts with mismatches in the middle of drafts."""

    def __init__(self, references: Sequence[Sequence[int]], k: int, vocab: int, wrong: float, seed: int) -> None:
        self.config = DraftConfig(prompt_lookup_num_tokens=k)
        self.references, self.k, self.vocab, self.wrong = references, k, vocab, wrong
        self.rng = random.Random(seed)
        self.count = 0

    def new_request(self, prompt: Sequence[int], max_seq_len: int) -> _ReplayRequest:
        ref = self.references[self.count]
        self.count += 1
        return _ReplayRequest(prompt, max_seq_len, random.Random(self.rng.getrandbits(64)), ref, self.k, self.vocab,
                              self.wrong)


class RoundRobinDrafter:
    """Hands request ``i`` to ``drafters[i % len(drafters)]``: one batch, several draft kinds."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self.config = self.drafters[0].config
        self.count = 0

    def new_request(self, prompt: Sequence[int], max_seq_len: int):
        d = self.drafters[self.count % len(self.drafters)]
        self.count += 1
        return d.new_request(prompt, max_seq_len)
