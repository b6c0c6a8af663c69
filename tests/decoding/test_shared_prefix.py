"""Live prefix sharing (issue 23, ``n``): a request's full prompt blocks are registered as
soon as its prompt is computed, and the scheduler admits the choices of one prompt so that
the later ones map the first one's blocks instead of computing them again.

Checked: the prompt's full blocks are computed once for ``n`` choices (the scheduler's
``prefill_tokens_computed``/``prefix_tokens_reused``); every greedy choice equals the
prompt's single plain run token for token, with and without prompt lookup, for batch
sizes 1 to 4, under eviction pressure and when one choice is cancelled while the others
run; seeded sampling gives each choice what the same request run alone gives; a block
shared by live sequences is never evicted, and the partial last block is never shared.
No test depends on timing: which step a choice joins may vary, the counts asserted do not."""
from __future__ import annotations

import pytest

from promptlookup.decoding.scheduler import GenerationRequest, Scheduler
from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.runtime.base import EngineLimits, SamplingConfig
from promptlookup.runtime.kv_cache import BlockManager, KVPool
from promptlookup.runtime.torch_runner import TorchRunner
from tests.tiny import tiny_llama

BLOCK = 8
END_ID = 10**6  # never produced: every request runs to max_new_tokens
PROMPT = [5, 6, 7, 8, 9, 10, 11] * 5 + [12, 13]  # 37 tokens: 4 full blocks and a partial one
ALIGNED = [20, 21, 22, 23] * 8  # 32 tokens: its last block is full, so it is copied, not shared
MODEL = tiny_llama(seed=4, vocab_size=128)


def make_runner(batch: int, kv_tokens: int | None = None, reuse: bool = True) -> TorchRunner:
    limits = EngineLimits(max_batch_size=batch, max_input_len=64, max_seq_len=160, max_draft_len=8, vocab_size=128)
    return TorchRunner(MODEL, limits, tokens_per_block=BLOCK, max_tokens_in_paged_kv_cache=kv_tokens,
                       kv_cache_enable_block_reuse=reuse)


def drafter(lookup: bool):
    return make_drafter(DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2)) if lookup else None


def collect(handle) -> list[int]:
    tokens = []
    for ev in handle.events(timeout=300):
        tokens += ev.tokens
    assert handle.finish_reason == "length"
    return tokens


def alone(prompt: list[int], max_new: int, sampling: SamplingConfig = SamplingConfig(), request_id: int = 0) -> list[int]:
    """The request run by itself: plain decoding, a fresh runner without reuse."""
    s = Scheduler(make_runner(1, reuse=False), None)
    try:
        return collect(s.submit(GenerationRequest(prompt, max_new, END_ID, sampling, request_id)))
    finally:
        s.close()


@pytest.fixture(scope="module")
def reference() -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): alone(p, 24) for p in (PROMPT, ALIGNED)}


def run_choices(scheduler: Scheduler, prompt: list[int], n: int, max_new: int,
                sampling: SamplingConfig = SamplingConfig()) -> list[list[int]]:
    handles = [scheduler.submit(GenerationRequest(prompt, max_new, END_ID, sampling, request_id=i)) for i in range(n)]
    return [collect(h) for h in handles]


def no_leaks(scheduler: Scheduler, runner: TorchRunner) -> bool:
    scheduler.close()
    return all(c == 0 for c in runner.blocks.refcount)


@pytest.mark.parametrize("prompt", [PROMPT, ALIGNED], ids=["partial-tail", "aligned"])
def test_n_choices_compute_the_prompt_blocks_once(prompt):
    n = 4
    runner = make_runner(n)
    scheduler = Scheduler(runner, None)
    run_choices(scheduler, prompt, n, 4)
    shared = (len(prompt) - 1) // BLOCK * BLOCK  # tokens in whole blocks a later choice can map
    stats = scheduler.stats
    assert stats.prefill_tokens_computed + stats.prefix_tokens_reused == n * len(prompt)
    assert stats.prefix_tokens_reused >= (n - 1) * shared
    # the first choice computes the prompt; the others at most their last (partial or copied) block
    assert stats.prefill_tokens_computed <= len(prompt) + (n - 1) * BLOCK
    assert no_leaks(scheduler, runner)


def test_without_block_reuse_every_choice_computes_its_prompt():
    runner = make_runner(4, reuse=False)
    scheduler = Scheduler(runner, None)
    run_choices(scheduler, PROMPT, 4, 4)
    assert scheduler.stats.prefix_tokens_reused == 0 and scheduler.stats.prefill_tokens_computed == 4 * len(PROMPT)
    assert no_leaks(scheduler, runner)


@pytest.mark.parametrize("lookup", [False, True], ids=["plain", "lookup"])
@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_every_greedy_choice_equals_the_single_request(reference, batch, lookup):
    runner = make_runner(batch)
    scheduler = Scheduler(runner, drafter(lookup))
    for prompt in (PROMPT, ALIGNED):
        assert run_choices(scheduler, prompt, 4, 24) == [reference[tuple(prompt)]] * 4
    assert scheduler.stats.prefix_tokens_reused > 0
    if lookup:
        assert scheduler.stats.accepted > 0
    assert no_leaks(scheduler, runner)


@pytest.mark.parametrize("lookup", [False, True], ids=["plain", "lookup"])
def test_choices_stay_exact_under_eviction_pressure(reference, lookup):
    # room for two requests' worst case: other prompts evict cached blocks between the choices
    runner = make_runner(4, kv_tokens=2 * (len(PROMPT) + 24 + 8) + BLOCK)
    scheduler = Scheduler(runner, drafter(lookup))
    handles = []
    for prompt in (PROMPT, ALIGNED, PROMPT, ALIGNED):
        handles += [scheduler.submit(GenerationRequest(prompt, 24, END_ID, request_id=i)) for i in range(3)]
        handles += [scheduler.submit(GenerationRequest([40 + len(handles)] * 30, 24, END_ID))]
    got = [collect(h) for h in handles]
    for h, tokens in zip(handles, got):
        if tuple(h.request.prompt) in reference:
            assert tokens == reference[tuple(h.request.prompt)]
    assert runner.blocks.stats.evicted_blocks > 0
    assert no_leaks(scheduler, runner)


@pytest.mark.parametrize("cancelled", [0, 1], ids=["first-choice", "later-choice"])
def test_cancelling_one_choice_leaves_the_others_exact(cancelled):
    long_ref = alone(PROMPT, 80)
    runner = make_runner(3)
    scheduler = Scheduler(runner, drafter(True))
    handles = [scheduler.submit(GenerationRequest(PROMPT, 80, END_ID, request_id=i)) for i in range(3)]
    firsts = [next(h.events(timeout=300)).tokens for h in handles]  # every choice has run a step
    handles[cancelled].cancel()
    for i, h in enumerate(handles):
        rest = []
        for ev in h.events(timeout=300):
            rest += ev.tokens
        if i == cancelled:
            assert h.finish_reason == "cancelled"
        else:
            assert h.finish_reason == "length" and firsts[i] + rest == long_ref
    assert scheduler.stats.prefix_tokens_reused > 0
    assert no_leaks(scheduler, runner)


@pytest.mark.parametrize("lookup", [False, True], ids=["plain", "lookup"])
def test_seeded_choices_equal_each_request_alone(lookup):
    sampling = SamplingConfig(temperature=0.9, top_k=40, random_seed=11)
    runner = make_runner(4)
    scheduler = Scheduler(runner, drafter(lookup))
    got = run_choices(scheduler, PROMPT, 4, 20, sampling)
    assert got == [alone(PROMPT, 20, sampling, request_id=i) for i in range(4)]
    assert len({tuple(t) for t in got}) > 1  # the choices are distinct samples
    assert scheduler.stats.prefix_tokens_reused > 0
    assert no_leaks(scheduler, runner)


# ----------------------------------------------------------------------------- the block manager
def test_registered_prompt_blocks_are_shared_live_never_evicted_and_the_tail_stays_private():
    pool = KVPool(num_layers=1, num_kv_heads=1, head_dim=2, block_size=4, num_blocks=8)
    bm = BlockManager(pool)
    prompt = list(range(10, 20))  # 2 full blocks and a partial one of 2 tokens
    a, cached = bm.match_prefix(prompt)
    assert cached == 0 and bm.cached_blocks(prompt) == 0
    bm.ensure_capacity(a, len(prompt) + 1)
    bm.register_prefix(a, prompt, len(prompt))  # as after the step that computed the prompt
    assert bm.cached_blocks(prompt) == 2
    b, cached = bm.match_prefix(prompt)
    assert cached == 8 and b.blocks[:2] == a.blocks[:2]  # full blocks shared, refcount 2
    assert [bm.refcount[x] for x in a.blocks[:2]] == [2, 2]
    bm.ensure_capacity(b, len(prompt) + 1)
    assert b.blocks[2] != a.blocks[2]  # the partial block: each its own
    registered = set(bm.reg)
    bm.register_prefix(b, prompt, len(prompt))  # b maps a's blocks: nothing new to register
    assert set(bm.reg) == registered
    # fill the pool: the shared blocks, live, are never evicted
    c, _ = bm.match_prefix([90, 91, 92])
    bm.ensure_capacity(c, bm.num_available * 4 + len(c.blocks) * 4)
    with pytest.raises(Exception, match="full"):
        bm.ensure_capacity(c, (len(c.blocks) + 1) * 4)
    assert all(x in registered for x in a.blocks[:2]) and bm.stats.evicted_blocks == 0
    bm.release(c, [90, 91, 92])
    bm.release(a, prompt)  # the owner leaves first: b still holds the shared blocks
    assert [bm.refcount[x] for x in b.blocks[:2]] == [1, 1]
    bm.release(b, prompt)
    assert all(r == 0 for r in bm.refcount) and bm.cached_blocks(prompt) == 2
