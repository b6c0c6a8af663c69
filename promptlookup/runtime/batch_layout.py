"""Where a step's new tokens go and what they attend to: the host-side layout of one paged forward call.

One call of :class:`~.paged_llama.PagedLlama` processes a batch of sequences, each
contributing ``q_len[b]`` new tokens (padded to ``Q``). For sequence ``b`` the new tokens
fill slots ``ctx[b] - q_len[b] .. ctx[b] - 1`` of its block table and attend to the slots
before them and, among themselves, causally (a chain) or along a token tree
(:class:`SequenceRows`, the rule of :mod:`promptlookup.drafting.tree`). :func:`build_layout`
turns that into the tensors the forward pass reads (:class:`BatchLayout`).

Cost: O(B * Q) Python integers per step, one host-to-device copy of the row data, plus the
mask and the read slots when they are needed (see :func:`build_layout`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch.nn.attention.flex_attention import BlockMask

from ..drafting.tree import check_parents
from .kv_cache import SCRATCH_BLOCK

@dataclass
class BatchLayout:
    """Where a batch's new tokens go and what they attend to (all tensors on the model's device).

    ``input_ids``, ``positions``, ``write_slots``: ``[B, Q]`` (padding: token 0, position 0,
    the scratch slot). ``read_slots``: ``[B, K]`` slot of each attended position, or
    ``None`` when ``contiguous_start`` gives a single contiguous run of ``K`` slots (B == 1).
    ``mask``: ``[B, 1, Q, K]`` boolean (True = attend) or ``None`` for a single query.
    ``logit_rows``: flat indices into ``B * Q`` of the rows whose logits are wanted.
    ``block_mask``: when set, ``read_slots`` and ``mask`` are unused and attention reads
    the pool in place (:func:`~.paged_attention.pool_attention`).
    ``real_rows``: where some sequence feeds fewer than ``Q`` tokens, the flat indices of the
    rows that are not padding (ascending), and ``real_logit_rows`` the logit rows as indices
    into ``real_rows``, for a forward pass that skips the padding; ``None`` where there is none.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor | None
    contiguous_start: int
    kv_len: int
    mask: torch.Tensor | None
    logit_rows: torch.Tensor
    block_mask: BlockMask | None = None  # set: attention reads the pool in place (:mod:`.paged_attention`)
    real_rows: torch.Tensor | None = None
    real_logit_rows: torch.Tensor | None = None


Parents = Sequence[int] | None  # a step's row tree; None: a chain (each row's parent is the row before)


@dataclass
class SequenceRows:
    """The rows one sequence feeds into a step, as a tree over the rows (host lists).

    Row ``r`` sits in the sequence's logical slot ``base + r`` (``base = ctx - q``), where
    its K/V are written. ``parents[r]`` is the row it follows (``-1``: the cached context
    before the first row). A row's position is ``base + depth(r)``, with ``depth = 0`` for
    a row whose parent is ``-1``; it attends to every cached slot ``< base``, to its
    ancestor rows and to itself, and to nothing else. A chain (``parents = [-1, 0, 1, ...]``,
    the default) is ordinary causal attention; a token tree (drafts branching from the
    sequence's last token) uses the same rule, so both are one code path.

    Invariant: ``parents[r] < r``. Cost: O(q) Python integers (``visible`` as bitsets).
    """

    positions: list[int]  # [q]
    write_slots: list[int]  # [q] physical slots
    visible: list[int] | None  # [q] bitsets: bit c of visible[r] = row r sees row c; None for a chain


def row_tree(parents: Parents, q: int) -> tuple[list[int], list[int]]:
    """Each row's depth and the bitset of rows it sees (its ancestors and itself), for a
    step's ``q`` rows under ``parents`` (``None``: a chain). Raises ``ValueError`` unless
    ``parents[r] < r`` for every row. Cost: O(q) Python integer operations."""
    if parents is None:
        return list(range(q)), [(2 << r) - 1 for r in range(q)]
    if len(parents) != q:
        raise ValueError(f"{len(parents)} parents for {q} rows")
    check_parents(parents)
    depth = [0] * q
    seen = [0] * q
    for r, p in enumerate(parents):
        depth[r] = depth[p] + 1 if p >= 0 else 0
        seen[r] = (seen[p] if p >= 0 else 0) | (1 << r)
    return depth, seen


def sequence_rows(q: int, ctx: int, table: Sequence[int], parents: Parents, block_size: int) -> SequenceRows:
    """Positions, write slots and row visibility of one sequence's ``q`` rows ending at ``ctx``."""
    base = ctx - q
    write = [table[s // block_size] * block_size + s % block_size for s in range(base, ctx)]
    if parents is None:
        return SequenceRows(list(range(base, ctx)), write, None)
    depth, seen = row_tree(parents, q)
    return SequenceRows([base + d for d in depth], write, seen)


def _visibility(rows: SequenceRows, q: int) -> torch.Tensor:
    """``[q, q]`` booleans: row ``r`` sees row ``c`` (a lower triangle for a chain)."""
    if rows.visible is None:
        return torch.ones(q, q, dtype=torch.bool).tril_()
    return torch.tensor([[(m >> c) & 1 for c in range(q)] for m in rows.visible], dtype=torch.bool)


def build_layout(
    new_tokens: list[list[int]],
    contexts: list[int],
    block_tables: list[list[int]],
    logits_per_seq: list[int],
    block_size: int,
    device: torch.device,
    parents: Sequence[Parents] | None = None,
) -> BatchLayout:
    """Lay out a batch: sequence ``b`` feeds ``new_tokens[b]`` ending at context length ``contexts[b]``.

    ``logits_per_seq[b]`` trailing rows of sequence ``b`` get logits. ``parents[b]`` makes
    the rows a tree (see :class:`SequenceRows`); by default every sequence is a chain.
    Cost: O(B * Q) Python integers for the row data, which become one tensor (token ids,
    positions and write slots are views of it: one host-to-device copy), plus the mask
    (``Q > 1`` or ``B > 1``) and the read slots (a non-contiguous block table).
    """
    B = len(new_tokens)
    Q = max(len(t) for t in new_tokens)
    K = max(contexts)
    scratch = SCRATCH_BLOCK * block_size
    ids: list[int] = []
    pos: list[int] = []
    write: list[int] = []
    rows: list[int] = []
    real: list[int] = []
    layouts = []
    for b, (toks, ctx, table) in enumerate(zip(new_tokens, contexts, block_tables)):
        q = len(toks)
        sr = sequence_rows(q, ctx, table, parents[b] if parents is not None else None, block_size)
        layouts.append(sr)
        pad = Q - q
        ids += toks
        ids += [0] * pad
        pos += sr.positions
        pos += [0] * pad
        write += sr.write_slots
        write += [scratch] * pad
        rows.extend(range(b * Q + q - logits_per_seq[b], b * Q + q))
        real.extend(range(b * Q, b * Q + q))
    n_logits = len(rows)
    if len(real) == B * Q:
        real = []  # no padding
    else:  # the logit rows among the real rows (each sequence's logit rows are its last ones)
        compact = {r: i for i, r in enumerate(real)}
        rows += [compact[r] for r in rows]
    step = torch.tensor(ids + pos + write + rows + real, dtype=torch.long).to(device)
    per_row = step[: 3 * B * Q].view(3, B, Q)

    read = None
    contiguous_start = 0
    if B == 1 and all(y == x + 1 for x, y in zip(block_tables[0], block_tables[0][1:])):
        contiguous_start = block_tables[0][0] * block_size
    else:
        read = torch.full((B, K), scratch, dtype=torch.long)
        for b, (ctx, table) in enumerate(zip(contexts, block_tables)):
            p = torch.arange(ctx)
            blocks = torch.tensor(table, dtype=torch.long)
            read[b, :ctx] = blocks[p // block_size] * block_size + p % block_size
        read = read.to(device)

    mask = None
    if Q > 1 or B > 1:
        key_pos = torch.arange(K)
        mask = torch.zeros(B, Q, K, dtype=torch.bool)
        for b, (toks, ctx, sr) in enumerate(zip(new_tokens, contexts, layouts)):
            q = len(toks)
            base = ctx - q
            mask[b] = key_pos.view(1, K) < base
            mask[b, :q, base:ctx] = _visibility(sr, q)
            mask[b, q:, 0] = True  # padded rows: one finite key, logits dropped
        mask = mask.unsqueeze(1).to(device)
    return BatchLayout(
        input_ids=per_row[0],
        positions=per_row[1],
        write_slots=per_row[2],
        read_slots=read,
        contiguous_start=contiguous_start,
        kv_len=K,
        mask=mask,
        logit_rows=step[3 * B * Q : 3 * B * Q + n_logits],
        real_rows=step[3 * B * Q + 2 * n_logits :] if real else None,
        real_logit_rows=step[3 * B * Q + n_logits : 3 * B * Q + 2 * n_logits] if real else None,
    )
