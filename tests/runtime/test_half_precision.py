"""In bfloat16 and float16, speculative greedy runs part from plain greedy only at near-ties.

float32 runs are token-identical (tests/runtime/test_greedy_equivalence.py). In half
precision a verification step and a one-token step round differently, so the outputs may
differ; the claim (docs/sampling.md, "Half precision") is that they can do so only where
the plain run's two best logits are within the rounding noise between the two kinds of
forward pass. At a flip the plain run's top-2 gap is at most ``|e_a| + |e_b|``, the runs'
logit differences at the two best tokens (:mod:`promptlookup.evaluation.divergence`).
The tests measure that *pair error* at every position both runs scored with the same
prefix (verification rows included), hold it to ``NEAR_TIE_ULPS`` units in the last
place of the position's largest logit, and require every divergence to sit at a gap no
larger than the largest pair error measured at the positions where the runs agreed.
"""
from __future__ import annotations

import pytest
import torch

from promptlookup.drafting.base import DraftConfig
from promptlookup.evaluation.divergence import RecordedRun, first_divergence, record_run, ulp
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.torch_runner import TorchRunner
from tests.runtime.test_greedy_equivalence import make_prompts
from tests.tiny import tiny_llama

NEAR_TIE_ULPS = 16.0  # docs/sampling.md: measured pair errors <= 3 ulps (tiny), <= 9 (SmolLM2, bf16)
END_ID = 2
LOOKUP = DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)


def check_near_ties(pairs: list[tuple[RecordedRun, RecordedRun]]) -> tuple[int, int]:
    """Assert the near-tie claim for (plain, speculative) runs; return how many runs
    diverged and how many verification rows were compared."""
    comparisons = [first_divergence(plain, spec) for plain, spec in pairs]
    assert sum(spec.accepted for _, spec in pairs) > 0, "no draft was accepted: the comparison would test nothing"
    for c in comparisons:
        assert c.max_pair_error_ulps <= NEAR_TIE_ULPS, c.describe()
    noise = max(c.max_pair_error_ulps for c in comparisons)  # the rounding noise between the two passes
    diverged = [c for c in comparisons if c.position is not None]
    for (plain, spec), c in zip(pairs, comparisons):
        if c.position is not None:
            assert plain.tokens[: c.position] == spec.tokens[: c.position]
            assert c.gap_ulps <= noise, (c.describe(), noise)
    return len(diverged), sum(c.compared_verified for c in comparisons)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_tiny_llama_lookup_departs_from_plain_only_at_near_ties(dtype):
    """20 prompts over 4 random models. Here bfloat16 parts 4 of them (float16, with 3
    more significant bits, none or few): the gap check runs."""
    pairs = []
    limits = EngineLimits(max_batch_size=1, max_input_len=512, max_seq_len=768, max_draft_len=16, vocab_size=512)
    for seed in range(4):
        model = tiny_llama(seed=seed).to(dtype)
        for prompt in make_prompts(seed, 5):
            plain = record_run(TorchRunner(model, limits, tokens_per_block=8), prompt, max_new_tokens=64, end_id=END_ID)
            spec = record_run(TorchRunner(model, limits, tokens_per_block=8), prompt, max_new_tokens=64,
                              end_id=END_ID, draft=LOOKUP, draft_length_policy="full")
            pairs.append((plain, spec))
    diverged, verified = check_near_ties(pairs)
    assert verified >= 200  # hundreds of verification rows held to the premise
    if dtype == torch.bfloat16:
        assert diverged >= 1  # bfloat16 does part the runs: the gap check ran


def test_float32_runs_do_not_part():
    limits = EngineLimits(max_batch_size=1, max_input_len=512, max_seq_len=768, max_draft_len=16, vocab_size=512)
    model = tiny_llama(seed=0)
    for prompt in make_prompts(0, 3):
        plain = record_run(TorchRunner(model, limits, tokens_per_block=8), prompt, max_new_tokens=48, end_id=END_ID)
        spec = record_run(TorchRunner(model, limits, tokens_per_block=8), prompt, max_new_tokens=48,
                          end_id=END_ID, draft=LOOKUP, draft_length_policy="full")
        c = first_divergence(plain, spec)
        assert c.position is None and plain.tokens == spec.tokens, c.describe()
        assert c.compared_verified > 0 and spec.accepted > 0


def test_first_divergence_reports_the_position_and_the_gap():
    vocab = 8
    rows = [torch.zeros(vocab) for _ in range(3)]
    rows[0][3], rows[1][4], rows[2][5], rows[2][6] = 8.0, 8.0, 8.0, 7.9375  # a 1-ulp gap at position 2
    plain = RecordedRun([3, 4, 5], rows, [False] * 3, 0, torch.bfloat16)
    other_rows = [r.clone() for r in rows]
    other_rows[1][0] = 0.125  # 2 ulps (of 8.0) away from plain's row, not at the top tokens
    other = RecordedRun([3, 4, 6], other_rows, [False, True, True], 1, torch.bfloat16)
    c = first_divergence(plain, other)
    assert (c.position, c.plain_token, c.other_token) == (2, 5, 6)
    assert c.gap == 0.0625 and c.gap_ulps == 1.0
    assert (c.compared, c.compared_verified, c.max_error_ulps, c.max_pair_error_ulps) == (2, 1, 2.0, 0.0)
    assert ulp(8.0, torch.bfloat16) == 0.0625 and ulp(1.0, torch.float16) == 2.0 ** -10
    assert first_divergence(plain, plain).position is None


def test_smollm2_bf16_lookup_departs_from_plain_only_at_near_ties(smollm2_engine_dir):
    """The real model, its float32 weights run in bfloat16 (slow: marked by its fixture)."""
    from promptlookup.checkpoint.load import load_checkpoint
    from promptlookup.cli.inputs import encode_text
    from promptlookup.engine.config import read_engine_config
    from promptlookup.evaluation.grounded_prompts import code_edit_prompts
    from promptlookup.runtime import load_tokenizer

    tok = load_tokenizer(smollm2_engine_dir)
    model = load_checkpoint(smollm2_engine_dir, dtype="bfloat16")
    limits = read_engine_config(smollm2_engine_dir).limits
    pairs = []
    for text in code_edit_prompts(3)[1:]:  # the third parts from plain at a near tie (the gap check runs)
        prompt = encode_text(tok, text, use_chat_template=True)
        plain = record_run(TorchRunner(model, limits, max_tokens_in_paged_kv_cache=2048), prompt,
                           max_new_tokens=64, end_id=tok.eos_token_id)
        spec = record_run(TorchRunner(model, limits, max_tokens_in_paged_kv_cache=2048), prompt,
                          max_new_tokens=64, end_id=tok.eos_token_id, draft=LOOKUP, draft_length_policy="full")
        pairs.append((plain, spec))
    _, verified = check_near_ties(pairs)
    assert verified >= 50
