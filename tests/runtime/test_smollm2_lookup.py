"""Integration: the real SmolLM2 engine, prompt lookup token-identical to plain greedy."""
from __future__ import annotations

import pytest
import torch

from promptlookup.cli.inputs import encode_text
from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.evaluation.grounded_prompts import code_edit_prompts

MAX_NEW = 40
FIXED_COSTS = [0.0] + [1.0 + 0.05 * (q - 1) for q in range(1, 40)]  # a CPU-like table (docs/benchmarks.md)


@pytest.fixture(scope="module")
def smollm2(smollm2_engine_dir):
    from promptlookup.engine.load import load_runner
    from promptlookup.runtime import load_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    tok = load_tokenizer(smollm2_engine_dir)
    prompts = [encode_text(tok, p, use_chat_template=True) for p in code_edit_prompts(2)]
    prompts.append(tok("The quick brown fox jumps over the lazy dog. The quick brown fox")["input_ids"])
    runner = load_runner(smollm2_engine_dir, kv_cache_enable_block_reuse=True)
    # The engine's table was timed when it was built; a fixed one keeps draft lengths, and so
    # the acceptance asserted below, independent of how fast that machine was.
    runner.step_cost_table = FIXED_COSTS
    plain = [r.output_ids for r in generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=tok.eos_token_id)]
    yield runner, tok, prompts, plain
    torch.set_num_threads(threads)


def test_plain_matches_transformers(smollm2, smollm2_engine_dir):
    from promptlookup.checkpoint.load import load_checkpoint
    from promptlookup.evaluation.hf_baseline import hf_generate

    runner, tok, prompts, plain = smollm2
    hf_model = load_checkpoint(smollm2_engine_dir)  # the runner holds fused weights only
    assert hf_generate(hf_model, prompts[:1], max_new_tokens=MAX_NEW, end_id=tok.eos_token_id)[0] == plain[0]


@pytest.mark.parametrize(
    "workflow, draft",
    [
        ("v1", DraftConfig(10, 2)),
        ("v2", DraftConfig(10, 2)),
        ("v2", DraftConfig(16, mode="longest", adaptive=True)),
    ],
)
def test_lookup_is_token_identical_batched(smollm2, workflow, draft):
    runner, tok, prompts, plain = smollm2
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=tok.eos_token_id, draft=draft, workflow=workflow)
    assert [r.output_ids for r in got] == plain
    assert sum(r.accepted for r in got) > 0


@pytest.mark.parametrize(
    "draft, lookahead",
    [
        (DraftConfig(8, 2, max_candidates=4), None),
        (None, (3, 3, 3)),
        (DraftConfig(6, 2), (2, 3, 2)),
    ],
    ids=["tree-lookup-G4", "lookahead", "lookahead+lookup"],
)
def test_tree_modes_are_token_identical_batched(smollm2, draft, lookahead):
    from promptlookup.decoding.lookahead import LookaheadConfig

    runner, tok, prompts, plain = smollm2
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=tok.eos_token_id, draft=draft, workflow="v2",
                   lookahead=LookaheadConfig(*lookahead) if lookahead else None, draft_length_policy="full")
    assert [r.output_ids for r in got] == plain
    assert sum(r.accepted for r in got) > 0
