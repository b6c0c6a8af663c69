"""Paged KV cache: fixed-size blocks from a pool, with prefix reuse across requests.

Storage (:class:`KVPool`)
    One K and one V tensor per layer, shaped ``[kv_heads, num_blocks * block_size, head_dim]``.
    Token slot ``s = block * block_size + offset``. Block 0 is never handed out: it is the
    scratch block that padded positions of a batch write into.

Bookkeeping (:class:`BlockManager`)
    Every block is in exactly one state:

    - *free*: holds nothing useful;
    - *in use*: ``refcount > 0``, listed in the block table of a live sequence;
    - *cached*: ``refcount == 0`` but registered for reuse, evictable in LRU order.

    A *full* block is registered under the key ``(parent_key, tokens)``, where
    ``parent_key`` identifies the registered block before it (0 for the first block) and
    ``tokens`` are its ``block_size`` token ids; keys are unique integers, so a chain of
    keys identifies the whole token prefix (and thus the positions), exactly. The last,
    *partial* block of a released sequence is registered under its parent too, with its
    valid token ids, so that a V1 re-submission of the same sequence also finds the tail.

    A live sequence's full *prompt* blocks can be registered once computed
    (:meth:`BlockManager.register_prefix`; the scheduler does so right after a request's
    first step), not only when the sequence leaves: a request admitted later (another
    choice of the same prompt, another request with the same system prompt) shares them
    while their first owner still decodes. A registered block is never written again by anyone: its owner writes only
    at positions past its prompt, a sharer only in blocks it owns alone (below). It is
    never evicted while a live sequence references it (only ``refcount == 0`` blocks are
    in the LRU). The partial last prompt block is never shared live: each sequence
    computes (or copies) its own.

    ``match_prefix`` maps the longest cached prefix of a new request onto the blocks:
    full blocks are shared (refcount + 1, never written again); the first diverging or
    partial block is copied (or taken over, when it is an unused partial block), since the
    new request will write into it. At least one token is always left uncovered, because
    its forward pass produces the logits for the next token.

Size (:func:`pool_blocks`)
    ``KvCacheConfig.max_tokens`` tokens, or ``free_gpu_memory_fraction`` of the memory free
    once the weights are loaded (:func:`free_memory_bytes`), the smaller when both are
    given; neither: 2 x max_batch_size x max_seq_len tokens.

Costs: matching a prefix of L tokens is O(L) (hashing block tuples) plus the copy of at
most one block; registering a prompt's blocks is O(L), once per sequence (later calls
are O(1)); allocation and release are O(blocks); eviction is O(1) per block.
Reuse changes no output beyond floating-point reassociation: a reused block holds the
very K/V that were computed for the same tokens at the same positions.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import math

import torch

from ..drafting.tree import common_prefix_len
from ..errors import UserError
from .options import KvCacheConfig

SCRATCH_BLOCK = 0
FRACTION_FLAGS = "(--kv_cache_free_gpu_memory_fraction; quickstart_advanced.py: --kv_cache_fraction)"
MEMINFO = "/proc/meminfo"


def free_memory_bytes(device: torch.device) -> int:
    """Bytes free on ``device`` now: ``torch.cuda.mem_get_info`` on a GPU (after PyTorch's
    cached, unused blocks are handed back), ``MemAvailable`` of /proc/meminfo on the CPU
    (what the kernel can give without swapping). Any other device, or a CPU without
    /proc/meminfo, is a one-line :class:`UserError`. Cost: one driver call or one small read."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open(MEMINFO) as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024  # kB
        except (OSError, ValueError, IndexError):
            pass
        raise UserError(f"free_gpu_memory_fraction {FRACTION_FLAGS}: this system has no {MEMINFO} MemAvailable "
                        "to size the KV cache by; give --max_tokens_in_paged_kv_cache instead")
    raise UserError(f"free_gpu_memory_fraction {FRACTION_FLAGS}: the free memory of a {device.type} device cannot "
                    "be read; give --max_tokens_in_paged_kv_cache instead")


def pool_blocks(kv_cache: KvCacheConfig, max_batch_size: int, max_seq_len: int, tokens_per_block: int,
                bytes_per_token: int, device: torch.device) -> int:
    """The block count of a :class:`KVPool` (its scratch block included) for ``kv_cache``.

    ``max_tokens`` alone (or neither: 2 x ``max_batch_size`` x ``max_seq_len``, room for a
    full batch at full length and as much again for reuse): 1 + ceil(tokens / block).
    ``free_gpu_memory_fraction`` F: floor(F x free bytes / bytes of one block) blocks,
    scratch included, so the pool never holds more than F of what
    :func:`free_memory_bytes` reports (read now: call it once the weights are loaded);
    with ``max_tokens`` too, the smaller of the two pools. A fraction that leaves no room
    for one ``max_seq_len`` sequence is a one-line :class:`UserError` naming the least
    fraction that would. Cost: one free-memory read when a fraction is given."""
    fraction, max_tokens = kv_cache.free_gpu_memory_fraction, kv_cache.max_tokens
    if fraction is None and max_tokens is None:
        max_tokens = 2 * max_batch_size * max_seq_len
    by_tokens = None if max_tokens is None else 1 + -(-max_tokens // tokens_per_block)
    if fraction is None:
        assert by_tokens is not None
        return by_tokens
    free = free_memory_bytes(device)
    block_bytes = bytes_per_token * tokens_per_block
    blocks = int(fraction * free) // block_bytes
    need = 1 + -(-max_seq_len // tokens_per_block)
    if blocks < need:
        least = math.ceil(need * block_bytes / max(free, 1) * 1e4) / 1e4
        fix = (f"raise it to at least {least:g}" if least <= 1 else
               "even 1 is too little: free memory, or give --max_tokens_in_paged_kv_cache instead")
        raise UserError(f"free_gpu_memory_fraction {fraction:g} {FRACTION_FLAGS} of {free / 2**20:.1f} MiB free "
                        f"leaves a KV cache of {max(blocks - 1, 0) * tokens_per_block} tokens, less than one "
                        f"max_seq_len sequence ({max_seq_len} tokens, {need * block_bytes / 2**20:.1f} MiB); {fix}")
    return blocks if by_tokens is None else min(blocks, by_tokens)


class KVPool:
    """The K/V storage: per layer ``[kv_heads, num_blocks * block_size, head_dim]``."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        num_blocks: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        zeroed: bool = False,
    ) -> None:
        """``zeroed``: every slot starts at zero, for attention that reads whole blocks in
        place (:mod:`.paged_attention`): its masked slots get zero weight, and zero times a
        never-written NaN would still poison the row. Costs committing the whole pool at
        once; otherwise (``torch.empty``) pages are committed when first written."""
        self.block_size = block_size
        self.num_blocks = num_blocks
        slots = num_blocks * block_size
        new = torch.zeros if zeroed else torch.empty
        self.k = [new(num_kv_heads, slots, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [new(num_kv_heads, slots, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        for t in (*self.k, *self.v):  # padded reads land here, masked: they must be finite
            t[:, SCRATCH_BLOCK * block_size : (SCRATCH_BLOCK + 1) * block_size].zero_()

    @property
    def tokens(self) -> int:
        """Tokens the pool can hold for sequences (the scratch block excluded)."""
        return (self.num_blocks - 1) * self.block_size

    @property
    def dtype(self) -> torch.dtype:
        """The K/V element type (``KvCacheConfig.dtype`` resolved)."""
        return self.k[0].dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V tensors (the whole pool)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def commit(self) -> None:
        """Write every slot once (zeros), so the whole pool is resident now rather than page
        by page as blocks are first written: what a process holds after start-up is then
        what it will hold. Changes no output (unwritten slots are never read unmasked).
        Cost: one pass over :attr:`nbytes`."""
        for t in (*self.k, *self.v):
            t.zero_()

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy the K/V of slots ``src`` into slots ``dst`` in every layer (``dst`` slots must
        not be among the ``src`` slots of a later pair). Cost: one gather and one scatter per
        layer tensor, of ``len(src)`` rows."""
        device = self.k[0].device
        s = torch.tensor(src, dtype=torch.long, device=device)
        d = torch.tensor(dst, dtype=torch.long, device=device)
        for t in (*self.k, *self.v):
            t.index_copy_(1, d, t.index_select(1, s))

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        for t in (*self.k, *self.v):
            t[:, dst * bs : (dst + 1) * bs].copy_(t[:, src * bs : (src + 1) * bs])


@dataclass
class _Registration:
    key: int
    parent_key: int
    tokens: tuple[int, ...]
    full: bool


@dataclass
class CacheStats:
    matched_tokens: int = 0  # tokens served from cache by match_prefix
    matched_blocks: int = 0
    copied_blocks: int = 0
    evicted_blocks: int = 0


@dataclass
class SequenceBlocks:
    """A live sequence's block table; ``blocks[i]`` holds slots ``[i*bs, (i+1)*bs)``."""

    blocks: list[int] = field(default_factory=list)
    shared: int = 0  # leading blocks already registered (or with a registered twin)
    shared_key: int = 0  # the registration key of block ``shared - 1`` (0: none)


class BlockManager:
    """Allocation, reuse registry and LRU eviction for the blocks of a :class:`KVPool`."""

    def __init__(self, pool: KVPool, enable_reuse: bool = True) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_reuse = enable_reuse
        n = pool.num_blocks
        if n < 2:
            raise UserError("the KV cache needs at least 2 blocks; raise --max_tokens_in_paged_kv_cache")
        self.refcount = [0] * n
        self.free: list[int] = list(range(n - 1, SCRATCH_BLOCK, -1))  # pop() yields low ids first
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, oldest first
        self.reg: dict[int, _Registration] = {}  # block -> registration
        self.full_index: dict[tuple[int, tuple[int, ...]], int] = {}
        self.children: dict[int, set[int]] = {}  # parent key -> registered blocks under it
        self._next_key = 1
        self.stats = CacheStats()

    # ----------------------------------------------------------------- allocation
    @property
    def num_available(self) -> int:
        return len(self.free) + len(self.lru)

    @property
    def num_in_use(self) -> int:
        """Blocks referenced by live sequences (``refcount > 0``). O(blocks)."""
        return sum(1 for c in self.refcount if c > 0)

    def _take_free_block(self) -> int:
        if self.free:
            block = self.free.pop()
        elif self.lru:
            block, _ = self.lru.popitem(last=False)
            self._unregister(block)
            self.stats.evicted_blocks += 1
        else:
            raise UserError(
                f"the paged KV cache is full (all {self.pool.tokens} tokens, {self.pool.num_blocks - 1} blocks of "
                f"{self.block_size}, in use); raise --max_tokens_in_paged_kv_cache above it (a sequence takes its "
                "prompt plus its output, rounded up to whole blocks) or lower the batch size"
            )
        self.refcount[block] = 1
        return block

    def ensure_capacity(self, seq: SequenceBlocks, num_slots: int) -> None:
        """Grow ``seq`` so that its blocks cover ``num_slots`` token slots."""
        needed = -(-num_slots // self.block_size)
        while len(seq.blocks) < needed:
            seq.blocks.append(self._take_free_block())

    def _acquire(self, block: int) -> None:
        if self.refcount[block] == 0:
            self.lru.pop(block, None)
        self.refcount[block] += 1

    def _drop(self, block: int) -> None:
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            if block in self.reg:
                self.lru[block] = None
            else:
                self.free.append(block)

    # ----------------------------------------------------------------- registry
    def _unregister(self, block: int) -> None:
        r = self.reg.pop(block, None)
        if r is None:
            return
        if r.full:
            self.full_index.pop((r.parent_key, r.tokens), None)
        kids = self.children.get(r.parent_key)
        if kids is not None:
            kids.discard(block)
            if not kids:
                del self.children[r.parent_key]

    def _register(self, block: int, parent_key: int, tokens: tuple[int, ...], full: bool) -> int:
        key = self._next_key
        self._next_key += 1
        self.reg[block] = _Registration(key, parent_key, tokens, full)
        if full:
            self.full_index[(parent_key, tokens)] = block
        self.children.setdefault(parent_key, set()).add(block)
        return key

    # ----------------------------------------------------------------- reuse
    def _cached_chain(self, tokens: Sequence[int], limit: int) -> list[int]:
        """The registered full blocks that hold the longest prefix of ``tokens[:limit]``
        in whole blocks, in order. Read-only; O(limit)."""
        bs = self.block_size
        chain: list[int] = []
        parent = 0
        while (len(chain) + 1) * bs <= limit:
            block = self.full_index.get((parent, tuple(tokens[len(chain) * bs : (len(chain) + 1) * bs])))
            if block is None:
                break
            chain.append(block)
            parent = self.reg[block].key
        return chain

    def cached_blocks(self, tokens: Sequence[int]) -> int:
        """How many full blocks :meth:`match_prefix` would share for a request of
        ``tokens`` now (0 with reuse off). Read-only; O(len(tokens))."""
        if not self.enable_reuse or len(tokens) < 2:
            return 0
        return len(self._cached_chain(tokens, len(tokens) - 1))

    def register_prefix(self, seq: SequenceBlocks, tokens: Sequence[int], length: int) -> None:
        """Make the full blocks of live ``seq`` that hold ``tokens[:length]`` shareable now.

        The caller guarantees that those slots hold their final K/V: computed, and never
        written again by ``seq`` (a prompt after its first step). Blocks already registered
        (shared from the cache) keep their registration; a block whose twin (same tokens
        under the same parent) is registered stays private. Registered blocks are
        referenced by ``seq`` until it is released, so they cannot be evicted meanwhile.
        No-op with reuse off. O(new blocks); O(1) when nothing is new.
        """
        bs = self.block_size
        full = min(length, len(tokens), len(seq.blocks) * bs) // bs
        if not self.enable_reuse or seq.shared >= full:
            return
        parent = seq.shared_key
        for i in range(seq.shared, full):
            block = seq.blocks[i]
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            r = self.reg.get(block)
            if r is not None and r.full:  # shared from the cache
                parent = r.key
                continue
            twin = self.full_index.get((parent, chunk))
            parent = self.reg[twin].key if twin is not None else self._register(block, parent, chunk, True)
        seq.shared, seq.shared_key = full, parent

    def match_prefix(self, tokens: Sequence[int]) -> tuple[SequenceBlocks, int]:
        """Start a sequence for ``tokens``; return it and how many leading tokens are cached.

        The count is at most ``len(tokens) - 1``. Shared full blocks are never written
        again by the new sequence: writing starts in a block it owns alone. Raises
        :class:`UserError` when the cache is full, leaving every refcount as it was.
        """
        seq = SequenceBlocks()
        if not self.enable_reuse or len(tokens) < 2:
            return seq, 0
        bs = self.block_size
        limit = len(tokens) - 1  # tokens that may come from the cache
        for block in self._cached_chain(tokens, limit):
            self._acquire(block)
            seq.blocks.append(block)
        parent = self.reg[seq.blocks[-1]].key if seq.blocks else 0
        matched = len(seq.blocks) * bs
        seq.shared, seq.shared_key = len(seq.blocks), parent
        self.stats.matched_blocks += len(seq.blocks)
        # The first block not matched in full: the longest common prefix among its siblings.
        best, best_len = -1, 0
        rest = tokens[matched:limit]
        for block in self.children.get(parent, ()):
            cand = self.reg[block].tokens
            n = common_prefix_len(cand, rest)
            if n > best_len:
                best, best_len = block, n
        if best_len:
            r = self.reg[best]
            if not r.full and self.refcount[best] == 0:
                # An unused partial tail (typically this very sequence's previous V1 call).
                self.lru.pop(best)
                self._unregister(best)
                self.refcount[best] = 1
                seq.blocks.append(best)
            else:
                try:
                    block = self._take_free_block()
                except UserError:  # a full cache: give back the blocks matched so far
                    for shared in reversed(seq.blocks):
                        self._drop(shared)
                    self.stats.matched_blocks -= len(seq.blocks)
                    raise
                self.pool.copy_block(best, block)
                seq.blocks.append(block)
                self.stats.copied_blocks += 1
            matched += best_len
        self.stats.matched_tokens += matched
        return seq, matched

    def release(self, seq: SequenceBlocks, tokens: Sequence[int]) -> None:
        """End a sequence whose first ``len(tokens)`` slots hold valid K/V for ``tokens``.

        With reuse on, its full blocks and its partial tail are registered (unless an
        identical block is already registered) and become evictable once unreferenced.
        """
        bs = self.block_size
        if self.enable_reuse:
            parent = 0
            for i, block in enumerate(seq.blocks):
                chunk = tuple(tokens[i * bs : (i + 1) * bs])
                if not chunk:
                    break
                full = len(chunk) == bs
                r = self.reg.get(block)
                if r is not None:  # a shared block: already registered
                    if not r.full:
                        break
                    parent = r.key
                    continue
                if full:
                    twin = self.full_index.get((parent, chunk))
                    if twin is not None:
                        parent = self.reg[twin].key
                        continue
                    parent = self._register(block, parent, chunk, True)
                else:
                    self._register(block, parent, chunk, False)
        # Drop the tail first so that, in LRU order, leaves are evicted before their parents.
        for block in reversed(seq.blocks):
            self._drop(block)
        seq.blocks.clear()
        seq.shared = seq.shared_key = 0
