"""Greedy prompt lookup is token-identical to plain greedy decoding.

Checked against Hugging Face's own ``generate`` on tiny random models, for V1 and V2,
batched (different prompt lengths) and unbatched, over several (k, n) settings, drafter
modes, block reuse on and off, and a KV budget small enough to force eviction. The same
checks run on weight-only int8 and int4 engines (params ``int8``/``int4``), whose reference
is our own plain decoding of each prompt alone (Hugging Face has no such products); ``int4_lm``
is int4 with ``--quantize_lm_head`` on a tied model (one quantized table for the embedding and
the LM head), ``int8_lm`` int8 with it on an untied one (table and head quantized apart).
``f16kv`` and ``int4_f16kv`` keep K/V in a float16 cache (``KvCacheConfig(dtype="float16")``)
under a float32 and an int4 engine; their reference is plain decoding on the same cache.
"""
import functools
import random

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.options import KvCacheConfig
from promptlookup.runtime.torch_runner import TorchRunner
from tests.quantized import quantized_model
from tests.tiny import tiny_llama

END_ID = 2
MAX_NEW = 48


def make_prompts(seed: int, count: int = 5) -> list[list[int]]:
    """Prompts with repeated phrases (so drafts exist) over a small alphabet."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        phrases = [[rng.randrange(3, 60) for _ in range(rng.randrange(2, 7))] for _ in range(4)]
        p = []
        while len(p) < rng.randrange(6, 140):
            p.extend(rng.choice(phrases) if rng.random() < 0.7 else [rng.randrange(3, 500)])
        prompts.append(p)
    return prompts


# The float16 KV cache's whole-decoding runs are slow-marked (make test runs them; test-fast
# keeps its kernels' and runner's tests: tests/runtime/test_kv_half.py, test_kv_dtype.py).
FLOAT16_KV_PARAMS = [pytest.param(p, marks=pytest.mark.slow) for p in ("f16kv", "int4_f16kv")]


@pytest.fixture(scope="module", params=[0, 1, "int8", "int4", "int4_lm", "int8_lm", "int8g", *FLOAT16_KV_PARAMS])
def model_and_reference(request):
    """(a runner factory taking runner_for's keywords, the prompts, each prompt's plain output)."""
    if isinstance(request.param, str):  # ours alone: plain decoding, one prompt at a time
        precision = request.param.removesuffix("f16kv").removesuffix("_")
        model = tiny_llama(seed=0, tie_word_embeddings=precision == "int4_lm")
        if precision:
            model = quantized_model(model, precision)
        make = functools.partial(runner_for, model, kv_dtype="float16" if request.param.endswith("f16kv") else "auto")
        prompts = make_prompts(0)
        reference = [generate(make(), [p], max_new_tokens=MAX_NEW, end_id=END_ID)[0].output_ids for p in prompts]
        return make, prompts, reference
    model = tiny_llama(seed=request.param)
    prompts = make_prompts(request.param)
    reference = []
    with torch.inference_mode():
        for p in prompts:
            out = model.generate(
                torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=END_ID, pad_token_id=0
            )[0, len(p):].tolist()
            if END_ID in out:
                out = out[: out.index(END_ID) + 1]
            reference.append(out)
    return functools.partial(runner_for, model), prompts, reference


def runner_for(model, reuse=True, kv_tokens=None, block=8, kv_dtype="auto"):
    limits = EngineLimits(max_batch_size=8, max_input_len=512, max_seq_len=768, max_draft_len=16, vocab_size=512)
    return TorchRunner(model, limits, tokens_per_block=block,
                       kv_cache=KvCacheConfig(enable_block_reuse=reuse, max_tokens=kv_tokens, dtype=kv_dtype))


DRAFTS = [
    DraftConfig(prompt_lookup_num_tokens=1, max_matching_ngram_size=1),
    DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2),
    DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2),
    DraftConfig(prompt_lookup_num_tokens=16, max_matching_ngram_size=4, is_keep_all=False, is_use_oldest=False),
    DraftConfig(prompt_lookup_num_tokens=8, mode="longest"),
    DraftConfig(prompt_lookup_num_tokens=12, mode="longest", adaptive=True),
]


def test_plain_matches_hf_generate(model_and_reference):
    make, prompts, reference = model_and_reference
    runner = make()
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID)
    assert [r.output_ids for r in got] == reference


@pytest.mark.parametrize("workflow", ["v1", "v2"])
@pytest.mark.parametrize("draft", DRAFTS, ids=lambda d: f"{d.mode}-k{d.prompt_lookup_num_tokens}-n{d.max_matching_ngram_size}"
                         + ("-adaptive" if d.adaptive else ""))
def test_batched_lookup_is_token_identical(model_and_reference, workflow, draft):
    make, prompts, reference = model_and_reference
    runner = make()
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
    assert [r.output_ids for r in got] == reference
    assert sum(r.accepted for r in got) > 0  # the drafts did real work
    for r in got:
        assert r.accepted <= r.drafted
        assert sum(r.draft_flags) == r.accepted and len(r.draft_flags) == len(r.output_ids)


@pytest.mark.parametrize("workflow", ["v1", "v2"])
@pytest.mark.parametrize("reuse", [True, False])
def test_unbatched_lookup_is_token_identical(model_and_reference, workflow, reuse):
    make, prompts, reference = model_and_reference
    runner = make(reuse=reuse)
    draft = DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=3)
    for p, ref in zip(prompts, reference):
        got = generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
        assert got[0].output_ids == ref


def test_v1_block_reuse_means_no_recomputation(model_and_reference):
    make, prompts, _ = model_and_reference
    # the same pool rules for both workflows, so both verify the same drafts
    draft = DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2, pool_rules="v2")
    counts = {}
    for name, workflow, reuse in [("v2", "v2", True), ("v1", "v1", True), ("v1-noreuse", "v1", False)]:
        runner = make(reuse=reuse)
        generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow,
                 draft_length_policy="full")  # measured step costs would make draft lengths vary
        counts[name] = (runner.stats.forward_tokens, runner.stats.reused_tokens)
    # With reuse, V1 runs exactly the tokens V2 runs: the re-submitted prefix costs nothing.
    assert counts["v1"][0] == counts["v2"][0]
    assert counts["v1"][1] > 0
    assert counts["v1-noreuse"][1] == 0
    assert counts["v1-noreuse"][0] > 3 * counts["v2"][0]


def test_reuse_across_requests_skips_the_shared_prefix(model_and_reference):
    make, prompts, _ = model_and_reference
    runner = make()
    shared = prompts[0] * 2
    generate(runner, [shared + [7, 8, 9]], max_new_tokens=4, end_id=END_ID)
    before = runner.stats.forward_tokens
    generate(runner, [shared + [10, 11]], max_new_tokens=1, end_id=END_ID)
    fed = runner.stats.forward_tokens - before
    assert fed <= 2 + runner.pool.block_size  # only the divergent tail, not the shared prefix


@pytest.mark.parametrize("workflow", ["v1", "v2"])
def test_eviction_under_a_tiny_budget_keeps_output_exact(model_and_reference, workflow):
    make, prompts, reference = model_and_reference
    longest = max(len(p) for p in prompts) + MAX_NEW + 16
    runner = make(kv_tokens=longest + 24, block=4)  # room for about one sequence
    draft = DraftConfig(prompt_lookup_num_tokens=8, max_matching_ngram_size=2)
    for p, ref in zip(prompts, reference):
        got = generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
        assert got[0].output_ids == ref
    assert runner.blocks.stats.evicted_blocks > 0


@pytest.mark.parametrize("workflow", ["v1", "v2"])
def test_prompt_at_max_input_len_may_grow_past_it(model_and_reference, workflow):
    """V1 re-submits prompt + output; only max_seq_len bounds those whole sequences."""
    make, _, _ = model_and_reference
    runner = make()
    prompt = [5, 6, 7, 8] * (runner.limits.max_input_len // 4)
    plain = generate(make(), [prompt], max_new_tokens=24, end_id=END_ID)
    got = generate(runner, [prompt], max_new_tokens=24, end_id=END_ID, workflow=workflow,
                   draft=DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2))
    assert got[0].output_ids == plain[0].output_ids
