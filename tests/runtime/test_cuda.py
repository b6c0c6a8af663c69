"""The PyTorch backend on a CUDA GPU: the same exactness guarantees as on the CPU.

Skipped where no GPU is visible (CI); run on a GPU machine with ``pytest tests/runtime/test_cuda.py``.
Greedy prompt lookup on the GPU must equal plain greedy decoding on the GPU token for token,
and plain decoding must equal Hugging Face ``generate`` on the same GPU, with CUDA graphs
(the default there) and without.
"""
import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.cuda_graphs import next_pow2
from promptlookup.runtime.device import resolve_device
from promptlookup.runtime.torch_runner import TorchRunner
from tests.runtime.test_greedy_equivalence import DRAFTS, END_ID, MAX_NEW, make_prompts, runner_for
from tests.tiny import tiny_llama



def cuda(test):
    """A test that needs a CUDA GPU: marked ``gpu``, and skipped where none is visible."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")(test))


def test_resolve_device_refuses_what_is_not_here():
    assert resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(UserError, match="--device 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(UserError, match="not a device"):
        resolve_device("cuda:x")
    if torch.cuda.device_count() < 8:
        with pytest.raises(UserError, match="not available here"):
            resolve_device("cuda:7")


def test_cuda_graph_mode_needs_a_gpu_model():
    limits = EngineLimits(max_batch_size=2, max_input_len=64, max_seq_len=128, max_draft_len=4, vocab_size=512)
    with pytest.raises(UserError, match="--cuda_graph_mode needs the model on a CUDA device"):
        TorchRunner(tiny_llama(seed=0), limits, cuda_graph_mode=True)
    assert TorchRunner(tiny_llama(seed=0), limits).graphs is None  # CPU: eager, no graphs


def test_next_pow2():
    assert [next_pow2(x) for x in (1, 2, 3, 4, 5, 31, 33)] == [1, 2, 4, 4, 8, 32, 64]


@pytest.fixture(scope="module")
def gpu_model_and_reference():
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 products, as on the CPU
    model = tiny_llama(seed=0).to("cuda")
    prompts = make_prompts(0)
    reference = []
    with torch.inference_mode():
        for p in prompts:
            out = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=END_ID, pad_token_id=0)[0, len(p):].tolist()
            if END_ID in out:
                out = out[: out.index(END_ID) + 1]
            reference.append(out)
    return model, prompts, reference


@cuda
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_plain_on_gpu_matches_hf_generate_on_gpu(gpu_model_and_reference, graphs):
    model, prompts, reference = gpu_model_and_reference
    runner = runner_for(model)
    if not graphs:
        runner.graphs = None
    assert runner.pool.k[0].device.type == "cuda"
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID)
    assert [r.output_ids for r in got] == reference
    if graphs:
        assert runner.graphs.graphs  # decoding steps ran on captured graphs


@cuda
def test_eager_gpu_lookup_is_token_identical(gpu_model_and_reference):
    model, prompts, reference = gpu_model_and_reference
    runner = runner_for(model)
    runner.graphs = None
    draft = DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    for workflow in ("v1", "v2"):
        got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
        assert [r.output_ids for r in got] == reference


@cuda
@pytest.mark.parametrize("workflow", ["v1", "v2"])
@pytest.mark.parametrize("draft", DRAFTS, ids=lambda d: f"{d.mode}-k{d.prompt_lookup_num_tokens}-n{d.max_matching_ngram_size}")
def test_gpu_lookup_is_token_identical(gpu_model_and_reference, workflow, draft):
    model, prompts, reference = gpu_model_and_reference
    batched = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
    assert [r.output_ids for r in batched] == reference
    assert sum(r.accepted for r in batched) > 0
    runner = runner_for(model, reuse=workflow == "v1")
    for p, ref in zip(prompts, reference):
        assert generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft,
                        workflow=workflow)[0].output_ids == ref


@cuda
def test_load_runner_places_the_engine_on_the_gpu(tiny_engine_dir):
    from promptlookup.engine.load import load_runner

    runner = load_runner(tiny_engine_dir, device="cuda")
    assert runner.model.device.type == "cuda"
    cpu = load_runner(tiny_engine_dir, device="cpu")
    prompt = [[5, 6, 7, 5, 6, 7, 5, 6]]
    draft = DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2)
    on_gpu = generate(runner, prompt, max_new_tokens=24, end_id=END_ID, draft=draft, workflow="v2")
    on_cpu = generate(cpu, prompt, max_new_tokens=24, end_id=END_ID, draft=draft, workflow="v2")
    assert on_gpu[0].output_ids == on_cpu[0].output_ids


@cuda
def test_warmup_captures_every_bucket_a_run_needs(gpu_model_and_reference):
    model, prompts, reference = gpu_model_and_reference
    runner = runner_for(model)
    longest = max(len(p) for p in prompts) + MAX_NEW
    captured = runner.graphs.warmup(len(prompts), longest)
    assert captured == len(runner.graphs.graphs) > 0
    draft = DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow="v2")
    assert [r.output_ids for r in got] == reference
    assert len(runner.graphs.graphs) == captured  # nothing left to capture during the run


@cuda
def test_compiled_graphs_reading_the_pool_in_place_are_token_identical(gpu_model_and_reference):
    """Inductor's step with FlexAttention over the pool, captured in CUDA graphs: plain and
    V2 lookup equal Hugging Face's greedy output, on one graph per (batch, tokens) bucket."""
    from promptlookup.runtime.paged_llama import PagedLlama

    model, prompts, reference = gpu_model_and_reference
    limits = EngineLimits(max_batch_size=8, max_input_len=512, max_seq_len=768, max_draft_len=7, vocab_size=512)
    runner = TorchRunner(PagedLlama.from_hf(model, dense_projections=True), limits, tokens_per_block=32,
                         compile_mode="inductor")
    draft = DraftConfig(prompt_lookup_num_tokens=7, max_matching_ngram_size=2)
    for d in (None, draft):
        got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=d, workflow="v2")
        assert [r.output_ids for r in got] == reference
    assert {k for _, _, k in runner.graphs.graphs} == {768}  # no context buckets


@cuda
def test_a_float16_kv_cache_on_the_gpu_keeps_lookup_exact_and_refuses_graphs(gpu_model_and_reference):
    """``KvCacheConfig(dtype="float16")`` under a float32 engine on the GPU: the eager route
    rounds K/V as written, and V1/V2 give plain decoding's tokens on that cache; the CUDA graphs
    (which read the pool in place, in the engine's dtype) refuse it in one line."""
    from promptlookup.runtime.options import KvCacheConfig, RuntimeConfig

    model, prompts, _ = gpu_model_and_reference
    limits = EngineLimits(max_batch_size=8, max_input_len=512, max_seq_len=768, max_draft_len=16, vocab_size=512)
    with pytest.raises(UserError, match="--no-cuda_graph_mode"):
        TorchRunner(model, limits, kv_cache=KvCacheConfig(dtype="float16"))
    runner = TorchRunner(model, limits, runtime=RuntimeConfig(cuda_graph_mode=False),
                         kv_cache=KvCacheConfig(dtype="float16"))
    assert runner.pool.dtype == torch.float16 and runner.pool.k[0].device.type == "cuda"
    plain = [r.output_ids for r in generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID)]
    draft = DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    for workflow in ("v1", "v2"):
        got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
        assert [r.output_ids for r in got] == plain
