"""promptlookup.LLM on a tiny engine: outputs equal decoding.generate's, statistics,
streaming, stop strings, KV blocks all released, and the configs' validation."""
from __future__ import annotations

import asyncio

import pytest

from promptlookup import LLM, KvCacheConfig, LookaheadDecodingConfig, NGramDecodingConfig, SamplingParams
from promptlookup.errors import UserError

PROMPTS = ["one two three four one two three four one two three", "a b a b a b a b", "hello world"]


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    with LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=6, max_matching_ngram_size=2),
             kv_cache_config=KvCacheConfig(enable_block_reuse=True)) as model:
        yield model


@pytest.fixture(scope="module")
def plain(tiny_engine_dir):
    with LLM(str(tiny_engine_dir)) as model:
        yield model


def reference(model: LLM, prompts, params: SamplingParams, draft=None):
    from promptlookup.decoding import generate

    ids = [model.encode(p)[1] for p in prompts]
    return generate(model.runner, ids, max_new_tokens=params.max_tokens, end_id=model.default_end_id,
                    sampling=params.sampling_config(), draft=draft, workflow="v2", draft_length_policy="full")


def no_blocks_in_use(model: LLM) -> bool:
    assert model.scheduler.wait_idle(60)
    return all(c == 0 for c in model.runner.blocks.refcount)


def test_greedy_equals_decoding_generate(llm, plain):
    params = SamplingParams(max_tokens=24)
    outs = llm.generate(PROMPTS, params)
    ref = reference(plain, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outs] == [r.output_ids for r in ref]
    assert [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params)] == [r.output_ids for r in ref]
    for o in outs:
        c = o.outputs[0]
        assert o.finished and c.finish_reason in ("stop", "length")
        assert c.text == llm.decode(c.token_ids)
        assert 0 <= c.accepted <= c.drafted and sum(c.draft_flags) == c.accepted
        assert 1 <= c.steps <= len(c.token_ids) and c.tokens_per_step >= 1
    assert sum(o.outputs[0].accepted for o in outs) > 0  # the repetitive prompts get drafts accepted
    assert no_blocks_in_use(llm)
    shown = repr(outs[2])
    assert shown.startswith(f"RequestOutput(request_id={outs[2].request_id}, prompt='hello world', ")
    assert f"text={outs[2].outputs[0].text!r}, token_ids={outs[2].outputs[0].token_ids}" in shown


def test_sampling_equals_decoding_generate(llm, plain):
    params = SamplingParams(max_tokens=16, temperature=0.8, top_k=20, seed=7)
    outs = llm.generate(PROMPTS, params)
    ref = reference(plain, PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outs] == [r.output_ids for r in ref]


def test_single_prompt_and_token_ids(llm):
    params = SamplingParams(max_tokens=8)
    one = llm.generate(PROMPTS[0], params)
    ids = llm.generate(llm.encode(PROMPTS[0])[1], params)
    assert one.outputs[0].token_ids == ids.outputs[0].token_ids
    assert one.prompt == PROMPTS[0] and ids.prompt is None


def test_streaming_pieces_add_up(llm):
    params = SamplingParams(max_tokens=20)
    final = llm.generate(PROMPTS[0], params).outputs[0]

    async def collect():
        texts, ids, updates = [], [], 0
        async for out in llm.generate_async(PROMPTS[0], params, streaming=True):
            texts.append(out.outputs[0].text_diff)
            ids.extend(out.outputs[0].token_ids_diff)
            updates += 1
        return "".join(texts), ids, updates, out

    text, ids, updates, last = asyncio.run(collect())
    assert ids == final.token_ids and text == final.text and updates > 1
    assert last.finished
    sync = llm.generate_async(PROMPTS[0], params)  # no running loop: sync result
    assert sync.result().outputs[0].token_ids == final.token_ids


def test_stop_string_cuts_text_and_frees_the_request(plain):
    params = SamplingParams(max_tokens=24)
    full = plain.generate(PROMPTS[1], params).outputs[0]
    words = full.text.split()
    if len(words) < 3:
        pytest.skip("the random model's output is too short to pick a stop string")
    stop = words[2]
    cut = plain.generate(PROMPTS[1], SamplingParams(max_tokens=24, stop=[stop])).outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full.text[: full.text.find(stop)]
    assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
    assert stop in plain.decode(cut.token_ids) and stop not in plain.decode(cut.token_ids[:-1])
    assert no_blocks_in_use(plain)


def test_bad_inputs_are_user_errors(llm):
    with pytest.raises(UserError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(UserError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(UserError, match="max_seq_len"):
        llm.generate("hi", SamplingParams(max_tokens=100000))
    with pytest.raises(UserError, match="prompt"):
        llm.generate([[]])
    with pytest.raises(UserError, match="exceeds max_matching_ngram_size"):
        NGramDecodingConfig(max_matching_ngram_size=2, min_matching_ngram_size=3)


def test_draft_longer_than_engine_is_refused(tiny_engine_dir):
    with pytest.raises(UserError, match="max_draft_len 64 exceeds"):
        LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=64))


def test_lookahead_config_validation():
    c = LookaheadDecodingConfig(max_window_size=4, max_ngram_size=3, max_verification_set_size=4)
    assert c.max_draft_len == 1 + (4 - 1 + 4) * 2  # TensorRT-LLM's rule
    for bad in (dict(max_window_size=0), dict(max_ngram_size=1), dict(max_verification_set_size=True)):
        with pytest.raises(UserError):
            LookaheadDecodingConfig(**bad)


def test_lookahead_through_the_llm_api_equals_plain(tiny_engine_dir):
    with LLM(str(tiny_engine_dir)) as plain_llm:
        plain = [o.outputs[0].token_ids for o in plain_llm.generate(PROMPTS[:3], SamplingParams(max_tokens=12))]
    spec = LookaheadDecodingConfig(max_window_size=2, max_ngram_size=3, max_verification_set_size=2)
    with LLM(str(tiny_engine_dir), speculative_config=spec) as model:
        outs = model.generate(PROMPTS[:3], SamplingParams(max_tokens=12))
    assert [o.outputs[0].token_ids for o in outs] == plain


def test_lookahead_too_wide_for_the_engine_is_refused(tiny_engine_dir):
    with pytest.raises(UserError, match="rebuild with --max_draft_len"):
        LLM(str(tiny_engine_dir), speculative_config=LookaheadDecodingConfig(8, 5, 8))


def test_dynamic_cache_is_saved_at_shutdown(tiny_engine_dir, tmp_path):
    path = tmp_path / "dynamic.ngram"
    spec = NGramDecodingConfig(max_draft_len=4, dynamic_cache=str(path))
    with LLM(str(tiny_engine_dir), speculative_config=spec) as model:
        model.generate(PROMPTS[:2], SamplingParams(max_tokens=8))
        assert not path.exists()
    assert path.is_file() and path.stat().st_size > 0
    with LLM(str(tiny_engine_dir), speculative_config=spec) as again:  # loads it back
        assert again.drafter.dynamic_cache is not None


def test_max_concurrency_and_draft_len_schedule_are_honoured_by_the_scheduler(tiny_engine_dir, plain, monkeypatch):
    from promptlookup.decoding import draft_budget as sched

    seen: list[tuple[int, int]] = []
    real = sched.draft_len_for

    def recording(live, k, max_concurrency=None, schedule=None):
        seen.append((live, real(live, k, max_concurrency, schedule)))
        return seen[-1][1]

    monkeypatch.setattr(sched, "draft_len_for", recording)
    prompts = ["one two three four one two three four one two three", "a b c a b c a b c a b"]
    params = SamplingParams(max_tokens=10)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    for cfg, rule in ((dict(max_concurrency=1), lambda live: 4 if live <= 1 else 0),
                      (dict(draft_len_schedule={1: 4, 2: 1}), lambda live: {1: 4, 2: 1}.get(live, 0))):
        seen.clear()
        with LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=4, **cfg)) as m:
            got = [o.outputs[0].token_ids for o in m.generate(prompts, params)]
        assert got == want
        assert seen and all(length == rule(live) for live, length in seen)
    with pytest.raises(UserError, match="mutually exclusive"):
        NGramDecodingConfig(max_draft_len=4, max_concurrency=2, draft_len_schedule={1: 4})
    with pytest.raises(UserError, match="must equal max_draft_len"):
        NGramDecodingConfig(max_draft_len=4, draft_len_schedule={2: 3})


@pytest.mark.parametrize("kwargs, message", [
    (dict(draft_token_budget=1), "draft_token_budget shapes speculative decoding, which is off"),
    (dict(draft_length_policy="full"), "draft_length_policy shapes speculative decoding, which is off"),
    (dict(speculative_config=LookaheadDecodingConfig(2, 3, 2), draft_token_budget=1),
     "a draft token budget sizes chain drafts; Lookahead"),
])
def test_draft_settings_nothing_would_read_are_refused(tiny_engine_dir, kwargs, message):
    with pytest.raises(UserError, match=message):
        LLM(str(tiny_engine_dir), **kwargs)


def test_build_settings_for_a_built_engine_are_refused(tiny_engine_dir, tmp_path):
    from promptlookup.api.model_cache import AutoBuild

    with pytest.raises(UserError, match="is a built engine, used as it is: cache_dir and build shape the build"):
        LLM(str(tiny_engine_dir), cache_dir=str(tmp_path / "c"), build=AutoBuild(max_batch_size=1))
    assert not (tmp_path / "c").exists()


def test_a_float16_kv_cache_through_the_llm_api(tiny_engine_dir):
    """``KvCacheConfig(dtype="float16")`` (TensorRT-LLM's field) reaches the runner: a float16
    pool, and the speculative output equals plain decoding's on that cache."""
    import torch

    from promptlookup.runtime.options import RuntimeConfig

    params = SamplingParams(max_tokens=12)
    spec = NGramDecodingConfig(max_draft_len=6, max_matching_ngram_size=2)
    kv = KvCacheConfig(dtype="float16")
    cpu = RuntimeConfig(device="cpu")  # a GPU's CUDA graphs read the cache in the engine's dtype (refused there)
    with LLM(str(tiny_engine_dir), kv_cache_config=kv, runtime_config=cpu) as plain16, \
            LLM(str(tiny_engine_dir), speculative_config=spec, kv_cache_config=kv, runtime_config=cpu) as spec16:
        assert plain16.runner.pool.dtype == spec16.runner.pool.dtype == torch.float16
        want = [o.outputs[0].token_ids for o in plain16.generate(PROMPTS, params)]
        assert [o.outputs[0].token_ids for o in spec16.generate(PROMPTS, params)] == want
