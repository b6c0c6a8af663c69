"""Lookahead decoding: the paper's mask, the window and pool rules, and exact output."""
import functools
import random

import pytest

from promptlookup.decoding import generate
from promptlookup.decoding.lookahead import (
    PROMPT,
    WINDOW,
    LookaheadConfig,
    LookaheadRequest,
    LookaheadPool,
    parse_lookahead_config,
    step_tokens,
    trtllm_draft_len,
)
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.options import KvCacheConfig
from promptlookup.runtime.torch_runner import TorchRunner
from tests.runtime.test_greedy_equivalence import END_ID, FLOAT16_KV_PARAMS, MAX_NEW, make_prompts
from tests.quantized import quantized_model
from tests.tiny import tiny_llama

CONFIGS = [(1, 2, 0), (3, 2, 2), (4, 3, 4), (2, 4, 3), (5, 5, 2)]


def warmed(config: LookaheadConfig, seed: int = 0) -> LookaheadRequest:
    """A request past warm-up, with some pool entries for its last token."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3, 40) for _ in range(30)]
    req = LookaheadRequest(config, prompt, seed=seed)
    while req.warming_up:
        req.build_tree([], window=True)
        nodes = sum(len(r) for r in req.levels)
        req.observe([rng.randrange(3, 40) for _ in range(nodes + 1)], [rng.randrange(3, 40)])
    for _ in range(config.max_verification_set_size + 1):
        req.pool.add(req.tokens[-1], [rng.randrange(3, 40) for _ in range(config.max_ngram_size - 1)], WINDOW)
    return req


def visible_sets(parents):
    out = []
    for j, p in enumerate(parents):
        out.append((out[p] if p >= 0 else frozenset()) | {j})
    return out


@pytest.mark.parametrize("w,n,g", CONFIGS)
def test_tree_mask_and_positions_match_the_papers_rule(w, n, g):
    config = LookaheadConfig(w, n, g)
    req = warmed(config)
    assert [len(r) for r in req.levels] == [w] * (n - 1)
    tree = req.build_tree(req.candidates(req.tokens[-1], g), window=True)
    seen = visible_sets(tree.parents)
    depth = tree.depths()
    index = {}
    for level, ids in enumerate(req.window_nodes):
        for col, j in enumerate(ids):
            index[(level, col)] = j
    assert len(index) == w * (n - 1)
    for (level, col), j in index.items():
        # level-l column-i token sees level-0 columns 0..i and column i of levels 1..l
        rule = {index[(0, c)] for c in range(col + 1)} | {index[(lv, col)] for lv in range(1, level + 1)}
        assert seen[j] == rule
        assert depth[j] == 1 + col + level  # position = root + 1 + i + l
        assert not tree.walkable[j]
    cands = req.pool.candidates(req.tokens[-1])[:g]
    cand_nodes = [j for j in range(len(tree)) if tree.walkable[j]]
    assert len(cand_nodes) <= g * (n - 1)
    for j in cand_nodes:  # candidates see only the root and their own earlier tokens
        assert all(tree.walkable[a] for a in seen[j])
        path = [tree.tokens[a] for a in sorted(seen[j], key=lambda a: depth[a])]
        assert any(list(c[: len(path)]) == path for c, _ in cands)
        assert depth[j] == len(path)
    assert len(tree) <= step_tokens(config)


def test_pool_is_lru_with_at_most_g_entries_per_key():
    pool = LookaheadPool(2)
    pool.add(1, [2, 3], WINDOW)
    pool.add(1, [4, 5], WINDOW)
    pool.add(1, [2, 3], PROMPT)  # re-inserted: most recent, relabelled
    pool.add(1, [6, 7], WINDOW)  # evicts the oldest, [4, 5]
    assert pool.candidates(1) == [((6, 7), WINDOW), ((2, 3), PROMPT)]
    assert LookaheadPool(0).candidates(1) == []


def test_window_update_makes_w_ngrams_and_moves_forward():
    config = LookaheadConfig(3, 3, 8)
    req = LookaheadRequest(config, [10, 11, 12, 13], seed=1)
    assert len(req.levels) == 1 and len(req.levels[0]) == 3 + 3 - 2
    tree = req.build_tree(req.candidates(13, 8), window=True)
    assert not any(tree.walkable)  # warm-up verifies nothing
    req.observe([0, 21, 22, 23, 24, 25], [30])
    assert req.levels[1] == [22, 23, 24]  # choices at level 0, first column dropped
    assert len(req.levels[0]) == 3 and not req.warming_up
    levels = [list(r) for r in req.levels]
    req.build_tree(req.candidates(30, 8), window=True)
    choices = [0] + [0] * 3 + [41, 42, 43]  # root, level 0 (3), level 1 (3)
    req.observe(choices, [31])
    for i in range(3):  # column i + the top's choice: key level0[i], continuation level1[i], choice
        assert ((levels[1][i], 41 + i), WINDOW) in req.pool.candidates(levels[0][i])
    assert req.levels == [levels[1], [41, 42, 43]]


def test_engine_rules():
    assert trtllm_draft_len(LookaheadConfig(4, 3, 4)) == 1 + 7 * 2
    assert step_tokens(LookaheadConfig(4, 3, 4)) == 2 * 4 + 4 * 2
    assert step_tokens(LookaheadConfig(1, 5, 0)) >= 2 * (1 + 5 - 1 - 2)  # a warm-up step can be the widest


@pytest.mark.parametrize("text,fragment", [
    ("[4,3", "malformed"), ("[4,3]", "3 items"), ("[0,3,4]", "W (max_window_size)"),
    ("[4,1,4]", "N (max_ngram_size)"), ("[4,3,-1]", "G (max_verification_set_size)"), ("[4,3.5,2]", "N"),
])
def test_bad_configs_are_one_line_errors(text, fragment):
    with pytest.raises(UserError) as err:
        parse_lookahead_config(text)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.fixture(scope="module", params=[0, 1, "int8", "int4", "int8g", *FLOAT16_KV_PARAMS])
def model_and_plain(request):
    """(a runner factory taking runner_for's keywords, the prompts, their plain outputs) for a tiny
    model (seeds 0, 1; ``int8``/``int4``/``int8g``: seed 0's weight-only quantized engine model;
    ``f16kv``, ``int4_f16kv``: seed 0's float32 and int4 engines over a float16 K/V cache)."""
    named = isinstance(request.param, str)
    precision = request.param.removesuffix("f16kv").removesuffix("_") if named else ""
    model = tiny_llama(seed=0 if named else request.param)
    if precision:
        model = quantized_model(model, precision)
    kv_dtype = "float16" if named and request.param.endswith("f16kv") else "auto"
    make = functools.partial(runner_for, model, kv_dtype=kv_dtype)
    prompts = make_prompts(0 if named else request.param)
    plain = generate(make(), prompts, max_new_tokens=MAX_NEW, end_id=END_ID)
    return make, prompts, [r.output_ids for r in plain]


def runner_for(model, reuse=True, kv_tokens=None, block=8, costs=None, kv_dtype="auto"):
    limits = EngineLimits(max_batch_size=8, max_input_len=512, max_seq_len=768, max_draft_len=40, vocab_size=512)
    return TorchRunner(model, limits, tokens_per_block=block, step_cost_table=costs,
                       kv_cache=KvCacheConfig(enable_block_reuse=reuse, max_tokens=kv_tokens, dtype=kv_dtype))


@pytest.mark.parametrize("w,n,g", [(1, 2, 1), (4, 3, 4), (3, 4, 2)])
@pytest.mark.parametrize("with_lookup", [False, True])
def test_lookahead_is_token_identical(model_and_plain, w, n, g, with_lookup):
    make, prompts, plain = model_and_plain
    draft = DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2) if with_lookup else None
    runner = make()
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, lookahead=LookaheadConfig(w, n, g),
                   draft=draft, draft_length_policy="full")
    assert [r.output_ids for r in got] == plain
    assert sum(r.accepted for r in got) > 0
    for r in got:
        assert sum(r.accepted_by_source.values()) == r.accepted
        assert sum(r.draft_flags) == r.accepted
    if with_lookup:
        assert sum(r.accepted_by_source.get("lookup", 0) + r.accepted_by_source.get(PROMPT, 0) for r in got) > 0


@pytest.mark.parametrize("reuse", [True, False])
def test_lookahead_unbatched_with_and_without_reuse(model_and_plain, reuse):
    make, prompts, plain = model_and_plain
    runner = make(reuse=reuse)
    for p, want in zip(prompts, plain):
        got = generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID, lookahead=LookaheadConfig(3, 3, 3))
        assert got[0].output_ids == want


def test_lookahead_under_eviction(model_and_plain):
    make, prompts, plain = model_and_plain
    longest = max(len(p) for p in prompts) + MAX_NEW + 48
    runner = make(kv_tokens=longest + 24, block=4)
    for p, want in zip(prompts, plain):
        got = generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID, lookahead=LookaheadConfig(4, 3, 4),
                       draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2))
        assert got[0].output_ids == want
    assert runner.blocks.stats.evicted_blocks > 0


def test_cost_policy_switches_an_expensive_window_off_without_changing_output(model_and_plain):
    make, prompts, plain = model_and_plain
    steep = [0.0] + [1.0 + 0.5 * (q - 1) for q in range(1, 64)]  # every extra token costs half a step
    runner = make(costs=steep)
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, lookahead=LookaheadConfig(4, 3, 4))
    assert [r.output_ids for r in got] == plain
    flat = make(costs=[0.0] + [1.0] * 63)
    wide = generate(flat, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, lookahead=LookaheadConfig(4, 3, 4))
    assert [r.output_ids for r in wide] == plain
    assert sum(r.tree_tokens for r in got) < sum(r.tree_tokens for r in wide)


def test_a_step_too_large_for_the_engine_is_refused(model_and_plain):
    make, prompts, _ = model_and_plain
    with pytest.raises(UserError, match=r"rebuild with --max_draft_len \d+"):
        generate(make(), prompts[:1], max_new_tokens=4, end_id=END_ID, lookahead=LookaheadConfig(8, 5, 8))


@pytest.mark.parametrize("with_lookup", [False, True])
def test_lookahead_in_the_v1_loop_with_resubmission_and_reuse(model_and_plain, with_lookup):
    """V1 re-submits whole sequences each step; block reuse maps them back after tree steps."""
    make, prompts, plain = model_and_plain
    runner = make()
    draft = DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2, mode="longest") if with_lookup else None
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, lookahead=LookaheadConfig(3, 3, 3),
                   draft=draft, workflow="v1", draft_length_policy="full")
    assert [r.output_ids for r in got] == plain
    assert sum(r.accepted for r in got) > 0
    assert runner.stats.reused_tokens > 0
