"""The inductor-compiled paged forward (``compile_mode="inductor"``) equals the eager one.

Compiled and eager forwards run the same operations in fp32, fused and summed in another
order, so logits agree to rounding: ``atol=1e-4`` is about a thousand times the rounding
error of a 64-wide fp32 dot product on these logits (|logit| < 10) and far below the gap
between distinct logits, and greedy choices must be identical. One compiled runner serves
every test (each new padded bucket costs a compile of seconds here). Attention reads the
KV pool in place (:mod:`promptlookup.runtime.paged_attention`), so contexts of any length
share a (batch, tokens) bucket: the tests check that too.

Inductor generates different code for each vector width, and an AVX2-only CPU once got
wrong attention where AVX-512 machines passed (see :mod:`promptlookup.runtime.paged_attention`).
So the compiled runner is built twice: at the widest width this machine has and at AVX2's
256 bits (``torch._inductor.config.cpp.simdlen``), and every compiled-vs-eager test runs on
both; a machine with AVX-512 thereby checks the AVX2 code too.
"""
import pytest
import torch
from torch._dynamo.utils import counters

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.compiled import CompiledForward, inductor_unavailable_reason
from promptlookup.runtime.cuda_graphs import StepBuckets
from promptlookup.runtime.kv_cache import SequenceBlocks
from promptlookup.runtime.paged_attention import check_compiled_attention
from promptlookup.runtime.paged_llama import PagedLlama, build_layout
from promptlookup.runtime.torch_runner import TorchRunner
from tests.runtime.test_greedy_equivalence import END_ID, make_prompts
from tests.tiny import tiny_llama

LIMITS = EngineLimits(max_batch_size=2, max_input_len=300, max_seq_len=320, max_draft_len=3, vocab_size=512)
TOP_K = 320  # the one context size of every bucket (max_seq_len in whole blocks)
BLOCK = 16  # the smallest block the compiled route takes (paged_attention.MIN_BLOCK_SLOTS)
ATOL = 1e-4
# inductor's vector width for the CPU code: None is the widest this machine has; 256 bits is AVX2's
VECTOR_WIDTHS = {"widest": None, "avx2": 256}


@pytest.fixture(scope="module", params=list(VECTOR_WIDTHS))
def compiled_runner(request) -> TorchRunner:
    reason = inductor_unavailable_reason(torch.device("cpu"))
    if reason is not None:
        pytest.skip(reason)
    width = VECTOR_WIDTHS[request.param]
    if width is not None and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU cannot run {request.param} code ({torch.backends.cpu.get_cpu_capability()})")
    # dynamo keeps compiled code on the function, guarded by shapes, not by inductor's settings:
    # reset it, so this width compiles afresh instead of reusing the other width's code
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.simdlen": width}):  # compiles happen lazily, inside the tests
        runner = TorchRunner(tiny_llama(seed=0), LIMITS, tokens_per_block=BLOCK, compile_mode="inductor")
        m = runner.model  # the probe the first compiled step runs (memoised): its graphs are counted apart
        assert check_compiled_attention("cpu", m.dtype, m.num_heads, m.num_kv_heads, m.head_dim, BLOCK) < ATOL
        yield runner
    torch._dynamo.reset()


def _prefill(runner: TorchRunner, prompt: list[int], room: int) -> SequenceBlocks:
    blocks = SequenceBlocks()
    runner.blocks.ensure_capacity(blocks, len(prompt) + room)
    runner.model(build_layout([prompt], [len(prompt)], [blocks.blocks], [1], BLOCK, runner.model.device),
                 runner.pool)
    return blocks


@pytest.mark.slow
def test_compiled_step_equals_eager_for_chains_trees_and_any_context(compiled_runner):
    runner = compiled_runner
    graphs_before = counters["stats"]["unique_graphs"]
    new = [[7, 8, 9], [11, 12, 13, 14]]
    n_logits = [3, 4]
    tree = [-1, 0, 0, 1]  # the second sequence's rows branch: rows 1 and 2 both follow row 0
    # contexts 40 and 75, then 40 and 290: a gathering step would need two context buckets
    for long_prompt in (list(range(100, 171)), [3 + i % 400 for i in range(286)]):
        prompts = [list(range(3, 40)), long_prompt]
        tables = [_prefill(runner, p, 8).blocks for p in prompts]
        contexts = [len(p) + len(t) for p, t in zip(prompts, new)]
        for parents in (None, [None, tree], [[-1, 0, 1], tree]):
            eager = runner.model(build_layout(new, contexts, tables, n_logits, BLOCK, runner.model.device, parents),
                                 runner.pool)
            compiled = runner.forward(new, contexts, tables, n_logits, parents)
            torch.testing.assert_close(compiled, eager, rtol=0, atol=ATOL)
            assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert runner.compiled.shapes == {(2, 4, TOP_K)}
    # one compiled layer serves every layer, every context and every step of the bucket
    assert runner.model.config.num_hidden_layers > 1
    assert counters["stats"]["unique_graphs"] - graphs_before == 1


@pytest.mark.slow
def test_compiled_greedy_equals_eager_plain_greedy_token_for_token(compiled_runner):
    prompts = make_prompts(0, count=2)
    prompts = [p[:80] for p in prompts]
    eager = TorchRunner(tiny_llama(seed=0), LIMITS, tokens_per_block=BLOCK)  # today's CPU path (oneDNN)
    plain = [r.output_ids for r in generate(eager, prompts, max_new_tokens=24, end_id=END_ID)]
    draft = DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2)
    for p, want in zip(prompts, plain):  # one sequence at a time: batch buckets of 1
        got = generate(compiled_runner, [p], max_new_tokens=24, end_id=END_ID, draft=draft)
        assert got[0].output_ids == want
    got = generate(compiled_runner, prompts[:1], max_new_tokens=24, end_id=END_ID)
    assert got[0].output_ids == plain[0]
    assert all(shape[2] == TOP_K for shape in compiled_runner.compiled.shapes)


def test_the_compiled_route_refuses_blocks_smaller_than_the_kernels_key_tile():
    if inductor_unavailable_reason(torch.device("cpu")) is not None:
        pytest.skip(inductor_unavailable_reason(torch.device("cpu")))
    with pytest.raises(UserError, match="--tokens_per_block is 8; rebuild it with --tokens_per_block 16 or more"):
        TorchRunner(tiny_llama(seed=0), LIMITS, tokens_per_block=8, compile_mode="inductor")


def test_a_compiled_attention_that_disagrees_with_eager_is_refused(monkeypatch):
    """The load-time probe: a compiled kernel that is off (here: shifted by 1) refuses the route in one line."""
    from promptlookup.runtime import paged_attention

    def off_by_one() -> object:
        return lambda *args: paged_attention.pool_attention(*args) + 1.0

    paged_attention._probe.cache_clear()
    monkeypatch.setattr(paged_attention, "_compile_attention", off_by_one)
    try:
        with pytest.raises(UserError, match="computes wrong attention on this machine .* off by 1 in a probe step"):
            paged_attention.check_compiled_attention("cpu", torch.float32, 4, 2, 16, BLOCK)
    finally:
        paged_attention._probe.cache_clear()


def test_bad_compile_mode_is_a_user_error():
    with pytest.raises(UserError, match="--torch_compile 'jit' is not a mode"):
        TorchRunner(tiny_llama(seed=0), LIMITS, tokens_per_block=BLOCK, compile_mode="jit")


def test_the_compiled_forward_refuses_onednn_packed_projections():
    model = PagedLlama.from_hf(tiny_llama(seed=0))  # CpuLinear on the CPU
    runner = TorchRunner(model, LIMITS, tokens_per_block=BLOCK)
    with pytest.raises(ValueError, match="dense_projections=True"):
        CompiledForward(model, runner.pool, StepBuckets.for_limits(2, 4, 128, BLOCK, by_context=False))


@pytest.mark.parametrize("by_context", [True, False])
def test_buckets_cover_every_step_a_run_can_feed(by_context):
    buckets = StepBuckets.for_limits(max_batch_size=3, max_q=5, max_seq_len=600, block_size=16, by_context=by_context)
    shapes = set(buckets.all_up_to(3, 600))
    assert (buckets.max_b, buckets.max_q, buckets.max_k) == (4, 8, 608)
    for batch in range(1, 4):
        for q in range(1, 6):
            for ctx in (1, 255, 256, 257, 600):
                assert buckets.bucket(batch, q, ctx) in shapes
    # batches 1, 2, 4 times tokens 1, 2, 4, 8; times contexts 256, 512, 608 when they split
    assert len(shapes) == 3 * 4 * (3 if by_context else 1)
    assert by_context or {k for _, _, k in shapes} == {608}


def test_in_place_attention_needs_buckets_that_do_not_split_contexts():
    model = PagedLlama.from_hf(tiny_llama(seed=0), dense_projections=True)
    runner = TorchRunner(model, LIMITS, tokens_per_block=BLOCK)
    if inductor_unavailable_reason(torch.device("cpu")) is not None:
        pytest.skip(inductor_unavailable_reason(torch.device("cpu")))
    with pytest.raises(ValueError, match="by_context=False"):
        CompiledForward(model, runner.pool, StepBuckets.for_limits(2, 4, 600, BLOCK))


def test_an_engine_loads_for_the_compiled_forward_with_its_weights_held_once(tiny_engine_dir):
    from promptlookup.engine.config import engine_weight_bytes
    from promptlookup.engine.load import load_runner
    from promptlookup.runtime.paged_llama import DenseLinear

    if inductor_unavailable_reason(torch.device("cpu")) is not None:
        pytest.skip(inductor_unavailable_reason(torch.device("cpu")))
    runner = load_runner(tiny_engine_dir, device="cpu", compile_mode="inductor")  # compiles nothing yet
    assert runner.compiled is not None and runner.compiled.shapes == set()
    assert all(isinstance(b.qkv, DenseLinear) for b in runner.model.layers)
    held, engine_bytes = runner.model.resident_weight_bytes(), engine_weight_bytes(tiny_engine_dir)
    assert 0.9 * engine_bytes <= held <= 1.15 * engine_bytes
