"""Log-probabilities of emitted tokens, from the target's own logits at each verified position.

What is reported (vLLM's default, ``raw_logprobs``): ``log_softmax`` over the whole
vocabulary of the model's **raw** logits at the position, before temperature, top-k/top-p,
penalties, ``logit_bias``, bad words or ``min_tokens`` change them. So a token's
log-probability is the model's, whatever the sampler did; a token that a processor forced
(or a sampled token the model thought unlikely) shows the model's opinion of it.

Exact under speculation: a draft token is kept only when it equals the target's choice at
its position, and the row of logits that chose it is the same computation plain decoding
runs for that position (the verification pass feeds the same prefix). Each emitted token's
entry is read from the row that chose it: the root's row for the first, then the row of
each accepted node for the next (:func:`along_path`). Where every kernel of the forward
pass is row-invariant the values are bitwise plain decoding's; on the CPU in float32 the
projections are (the C kernels, up to 96 rows) but PyTorch's attention is not, so the
values differ from plain decoding's by float32 rounding only (below 1e-5 on the tiny test
model, tests/decoding/test_logprobs.py), never in which tokens are reported.

Cost: computed on the device only for the rows of sequences that asked (``log_softmax``, a
comparison for the token's rank and a ``topk`` over ``rows x vocab``); the values travel in the step's one device-to-host copy
(:func:`fetch_step_with_logprobs`, float64: token ids are exact in it).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .acceptance import fetch_step, last_accepted_nodes
from .device import to_device
from .results import TokenLogprob
from .tree import DraftTree

__all__ = ["MAX_TOP_LOGPROBS", "TokenLogprob", "logprob_table", "fetch_step_with_logprobs", "along_path"]

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs (and the legacy completions' logprobs)


def logprob_table(logits: torch.Tensor, chosen: torch.Tensor, rows: Sequence[int], k: int) -> torch.Tensor:
    """Per row in ``rows`` of ``logits`` ``[all rows, vocab]`` (raw): the log-probability
    of ``chosen[row]``, its rank (1 + the tokens more likely), then the ``k`` most likely
    tokens and their log-probabilities, as a float64 tensor ``[len(rows), 2 + 2k]`` on the
    logits' device. Reads nothing back."""
    index = to_device(torch.tensor(list(rows), dtype=torch.long), logits.device)
    x = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    mine = x.gather(1, chosen.view(-1).index_select(0, index).unsqueeze(1))
    parts = [mine.double(), ((x > mine).sum(dim=1, keepdim=True) + 1).double()]
    if k:
        top = torch.topk(x, k, dim=-1)
        parts += [top.indices.double(), top.values.double()]
    return torch.cat(parts, dim=1)


def fetch_step_with_logprobs(
    trees: Sequence[DraftTree], chosen: torch.Tensor, end_id: int, logits: torch.Tensor | None,
    wanted: Sequence[int | None] | None,
) -> tuple[list[list[int]], list[list[int]], list[list[TokenLogprob] | None]]:
    """:func:`~.acceptance.fetch_step` plus, per tree whose ``wanted`` entry is not None
    (the number of top alternatives, 0 for none), the :class:`TokenLogprob` of every row
    (the root, then every node); None for the others. Still **one** device-to-host copy:
    the choices, the last accepted nodes and the table travel together as float64. When no
    tree asks (``wanted`` None or all None), exactly :func:`~.acceptance.fetch_step`'s int64 copy.
    ``logits``: the step's raw rows (every tree's root, then its nodes)."""
    if wanted is None or all(w is None for w in wanted):
        return (*fetch_step(trees, chosen, end_id), [None] * len(trees))
    if logits is None:
        raise ValueError("log-probabilities were asked for but the step kept no raw logits")
    sizes = [len(t) + 1 for t in trees]
    rows: list[int] = []
    start = 0
    for size, want in zip(sizes, wanted):
        if want is not None:
            rows += range(start, start + size)
        start += size
    k = max((w for w in wanted if w is not None), default=0)
    last = last_accepted_nodes(trees, chosen, end_id)
    table = logprob_table(logits, chosen, rows, k)
    host = torch.cat([chosen.view(-1).double(), last.double(), table.view(-1)]).tolist()
    choices, row = [], 0
    for size in sizes:
        choices.append([int(t) for t in host[row : row + size]])
        row += size
    paths = [tree.path_to(int(node)) for tree, node in zip(trees, host[row : row + len(trees)])]
    row += len(trees)
    width = 2 + 2 * k
    per_tree: list[list[TokenLogprob] | None] = []
    for size, want, mine in zip(sizes, wanted, choices):
        if want is None:
            per_tree.append(None)
            continue
        entries = []
        for r in range(size):
            cells = host[row : row + width]
            top = tuple((int(cells[2 + i]), cells[2 + k + i]) for i in range(want))
            entries.append(TokenLogprob(mine[r], cells[0], top, int(cells[1])))
            row += width
        per_tree.append(entries)
    return choices, paths, per_tree


def along_path(entries: Sequence[TokenLogprob] | None, path: Sequence[int]) -> list[TokenLogprob] | None:
    """The entries of a step's emitted tokens: the root's row chose the first (an accepted
    node or the target's own token), accepted node ``j``'s row (``j + 1``) the next."""
    if entries is None:
        return None
    return [entries[0]] + [entries[j + 1] for j in path]
