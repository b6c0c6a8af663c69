"""The LLM API's surface as vLLM/TensorRT-LLM users call it (issue 23, finding 11): ``chat``,
the penalties, ``n`` and ``logprobs`` in ``SamplingParams``, run.py's validation with errors
that name the API's parameters, and the documented finish reasons. Tiny random Llama engine."""
from __future__ import annotations

import json

import pytest

from promptlookup import LLM, NGramDecodingConfig, SamplingParams
from promptlookup.api import Logprob, validation
from promptlookup.errors import UserError
from promptlookup.text import chat_ids

TEXT = "one two three four one two three four one two three"
PROMPTS = [TEXT, "a b a b a b a b", "hello world"]
PENALTIES = dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3)


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    with LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=4, max_matching_ngram_size=2)) as m:
        yield m


def ids_of(out) -> list[int]:
    return out.outputs[0].token_ids


def one_line_naming(exc: BaseException, name: str) -> str:
    msg = str(exc)
    assert "\n" not in msg and name in msg and "--" not in msg, msg  # the API's name, never a CLI flag
    return msg


# --------------------------------------------------------------------- validation

@pytest.mark.parametrize("kwargs,name,kind", [
    (dict(temperature=float("nan")), "temperature", ValueError),
    (dict(temperature=float("inf")), "temperature", ValueError),
    (dict(temperature=-1), "temperature", ValueError),
    (dict(temperature="0.5"), "temperature", TypeError),
    (dict(top_p=float("nan")), "top_p", ValueError),
    (dict(top_p=float("inf")), "top_p", ValueError),
    (dict(max_tokens="4"), "max_tokens", TypeError),
    (dict(max_tokens=4.0), "max_tokens", TypeError),
    (dict(seed=True), "seed", TypeError),
    (dict(top_k=-1), "top_k", ValueError),
    (dict(end_id="2"), "end_id", TypeError),
    (dict(n=0), "n", ValueError),
    (dict(repetition_penalty=0.0), "repetition_penalty", ValueError),
    (dict(presence_penalty=float("nan")), "presence_penalty", ValueError),
    (dict(frequency_penalty=float("inf")), "frequency_penalty", ValueError),
    (dict(stop=5), "stop", TypeError),
    (dict(stop=[""]), "stop", ValueError),
    (dict(logit_bias={5: float("nan")}), "logit_bias[5]", ValueError),
    (dict(logit_bias={"5": 1.0}), "logit_bias", TypeError),
    (dict(logit_bias=3), "logit_bias", TypeError),
    (dict(min_tokens=-1), "min_tokens", ValueError),
    (dict(min_tokens=40, max_tokens=4), "min_tokens", ValueError),
])
def test_sampling_params_refuse_bad_values_naming_the_field(kwargs, name, kind):
    with pytest.raises(kind) as exc:
        SamplingParams(**kwargs)
    assert isinstance(exc.value, UserError)
    one_line_naming(exc.value, name)


def test_end_id_outside_the_vocabulary_is_refused(llm):
    with pytest.raises(ValueError) as exc:
        llm.generate("hi", SamplingParams(max_tokens=4, end_id=10**6))
    assert "outside the engine's vocabulary" in one_line_naming(exc.value, "end_id")
    with pytest.raises(ValueError):
        llm.generate_async("hi", SamplingParams(max_tokens=4, end_id=llm.limits.vocab_size)).result()
    with pytest.raises(ValueError) as exc:
        llm.generate("hi", SamplingParams(max_tokens=4, logit_bias={llm.limits.vocab_size: 1.0}))
    one_line_naming(exc.value, "logit_bias")


def test_generate_takes_a_dict_of_sampling_params(llm):
    assert ids_of(llm.generate("hi", {"max_tokens": 4})) == ids_of(llm.generate("hi", SamplingParams(max_tokens=4)))
    assert len(ids_of(llm.generate_async("hi", {"max_tokens": 3}).result())) <= 3
    with pytest.raises(TypeError) as exc:
        llm.generate("hi", {"max_token": 4})
    msg = one_line_naming(exc.value, "max_token")
    assert "got str" not in msg and "max_tokens" in msg  # the real field names are listed
    with pytest.raises(TypeError) as exc:
        llm.generate("hi", 4)
    one_line_naming(exc.value, "sampling_params")
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(PROMPTS, [{"max_tokens": 2}, SamplingParams()])


@pytest.mark.parametrize("bad", [None, 3, {"prompt": 5}, [None], ["hi", 3.5]])
def test_bad_prompts_are_a_type_error_naming_prompts(llm, bad):
    with pytest.raises(TypeError) as exc:
        llm.generate(bad)
    one_line_naming(exc.value, "prompts")


def test_unknown_keywords_say_where_they_go(llm):
    for kw in (dict(n=2), dict(logprobs=1), dict(max_tokens=4, temperature=0.5)):
        with pytest.raises(TypeError) as exc:
            llm.generate("hi", **kw)
        assert "SamplingParams(" in one_line_naming(exc.value, next(iter(kw)))
    with pytest.raises(TypeError) as exc:
        llm.generate("hi", use_tqdm=False)
    assert "unexpected keyword use_tqdm" in one_line_naming(exc.value, "sampling_params")
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(TypeError, match="tools"):
        llm.chat([{"role": "user", "content": "hi"}], tools=[])


def test_logprobs_in_range_are_honoured_and_out_of_range_refused(llm):
    assert SamplingParams(logprobs=None).logprobs is None
    assert SamplingParams(logprobs=0).logprobs == 0 and SamplingParams(logprobs=20).logprobs == 20
    for bad in (-1, 21):
        with pytest.raises(ValueError) as exc:
            SamplingParams(logprobs=bad)
        one_line_naming(exc.value, "logprobs")
    with pytest.raises(TypeError):
        SamplingParams(logprobs=True)
    outs = [llm.generate("one two one two one", SamplingParams(max_tokens=6, logprobs=3)).outputs[0],
            llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4, logprobs=0))[0].outputs[0]]
    for c, top in zip(outs, (3, 0)):
        assert len(c.logprobs) == len(c.token_ids) == len(c.token_logprobs)  # vLLM's shape, one dict per token
        for token, d, e in zip(c.token_ids, c.logprobs, c.token_logprobs):
            assert token in d and top <= len(d) <= top + 1 and all(v.logprob <= 0 for v in d.values())
            assert d[token] == Logprob(e.logprob, e.rank, llm.tokenizer.decode([token])) and e.rank >= 1  # vLLM's
            assert all(d[t] == Logprob(v, i + 1, llm.tokenizer.decode([t])) for i, (t, v) in enumerate(e.top)
                       if t != token)  # the top tokens ranked 1, 2, ...
    assert llm.generate("one two", SamplingParams(max_tokens=2)).outputs[0].logprobs is None


# --------------------------------------------------------------------- finish reasons

def test_abort_finishes_with_the_documented_reason(llm):
    assert validation.FINISH_REASONS == ("stop", "length", "abort")
    out = llm.generate_async(TEXT, SamplingParams(max_tokens=1000, end_id=llm.limits.vocab_size - 1), streaming=True)
    updates = iter(out)
    next(updates)
    out.abort()
    for _ in updates:
        pass
    assert out.finished and out.outputs[0].finish_reason == "abort"
    for o in llm.generate(PROMPTS, SamplingParams(max_tokens=6)):
        assert o.outputs[0].finish_reason in validation.FINISH_REASONS
    assert llm.scheduler.wait_idle(60) and all(c == 0 for c in llm.runner.blocks.refcount)


# --------------------------------------------------------------------- chat

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count: 1, 2, 3,"}]


def test_chat_equals_generate_of_the_templated_prompt(llm):
    params = SamplingParams(max_tokens=12)
    want = ids_of(llm.generate(chat_ids(llm.tokenizer, MESSAGES), params))
    got = llm.chat(MESSAGES, params)
    assert isinstance(got, list) and len(got) == 1 and ids_of(got[0]) == want
    assert got[0].prompt_token_ids == chat_ids(llm.tokenizer, MESSAGES)
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=5)
    assert ids_of(llm.chat(MESSAGES, sampled)[0]) == ids_of(llm.generate(chat_ids(llm.tokenizer, MESSAGES), sampled))


def test_chat_content_parts_and_several_conversations(llm):
    params = SamplingParams(max_tokens=8)
    parts = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "Count: 1,"},
                                                        {"type": "text", "text": "2, 3,"}]}]
    joined = [MESSAGES[0], {"role": "user", "content": "Count: 1,\n2, 3,"}]  # newlines, as vLLM joins parts
    assert llm.chat(parts, params)[0].prompt_token_ids == chat_ids(llm.tokenizer, joined)
    assert ids_of(llm.chat(parts, params)[0]) == ids_of(llm.chat(joined, params)[0])
    other = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
             {"role": "user", "content": "again"}]
    both = llm.chat([MESSAGES, other], params)
    assert [ids_of(o) for o in both] == [ids_of(llm.chat(MESSAGES, params)[0]),
                                          ids_of(llm.generate(chat_ids(llm.tokenizer, [
                                              other[0], {"role": "assistant", "content": ""}, other[2]]), params))]


@pytest.mark.parametrize("messages,name,kind", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "image_url", ValueError),
    ([{"role": "user", "content": [{"type": "text"}]}], "content[0]", ValueError),
    ([{"role": "user", "content": None}], "content", TypeError),
    ([{"role": "user", "content": 5}], "content", TypeError),
    ([{"content": "hi"}], "role", ValueError),
    ([{"role": "user"}], "content", ValueError),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "tool_calls", ValueError),
    (["hi"], "messages[0]", TypeError),
    ("hi", "messages", TypeError),
    ([], "messages", ValueError),
])
def test_chat_refuses_bad_messages(llm, messages, name, kind):
    with pytest.raises(kind) as exc:
        llm.chat(messages)
    one_line_naming(exc.value, name)


# --------------------------------------------------------------------- penalties

def run_py(engine, tmp_path, *args) -> list[list[int]]:
    from promptlookup.cli.run import main
    from promptlookup.errors import run_cli

    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as exc:
        run_cli(main, [str(a) for a in ("--engine_dir", engine, "--output_json", out, *args)])
    assert exc.value.code == 0
    return [s["output_ids"] for s in json.loads(out.read_text())["sequences"]]


@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, top_k=40, seed=11)])
def test_penalties_equal_run_py(llm, tiny_engine_dir, tmp_path, sampling):
    params = SamplingParams(max_tokens=16, **PENALTIES, **sampling)
    flags = [f for k, v in PENALTIES.items() for f in (f"--{k}", v)]
    if sampling:
        flags += ["--temperature", sampling["temperature"], "--top_k", sampling["top_k"],
                  "--random_seed", sampling["seed"]]
    inputs = [f for p in PROMPTS[:2] for f in ("--input_text", p)]
    want = run_py(tiny_engine_dir, tmp_path, "--max_output_len", 16, "--prompt_lookup_config", "[4,2]",
                  *inputs, *flags)
    assert [ids_of(o) for o in llm.generate(PROMPTS[:2], params)] == want
    unpenalized = SamplingParams(max_tokens=16, **sampling)
    assert [ids_of(o) for o in llm.generate(PROMPTS[:2], unpenalized)] != want  # the penalties did something


# --------------------------------------------------------------------- n samples

def test_n_samples_are_seeded_reproducible_and_equal_single_runs(llm):
    params = SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=3)
    one = SamplingParams(max_tokens=10, temperature=0.9, seed=7)

    def alone(prompt, request_id):
        return ids_of(llm.generate_async(prompt, one, request_id=request_id).result())

    out = llm.generate(TEXT, params)
    got = [c.token_ids for c in out.outputs]
    assert [c.index for c in out.outputs] == [0, 1, 2] and len({tuple(g) for g in got}) > 1
    assert got == [alone(TEXT, j) for j in range(3)]  # sample j: request id j, as serve.py's choices
    assert got[0] == ids_of(llm.generate(TEXT, one))  # n=1 is unchanged
    assert [c.token_ids for c in llm.generate(TEXT, params).outputs] == got  # reproducible
    batch = llm.generate(PROMPTS, params)  # sample j of prompt i (of P): request id i + j * P
    for i, o in enumerate(batch):
        assert [c.token_ids for c in o.outputs] == [alone(PROMPTS[i], i + j * len(PROMPTS)) for j in range(3)]
    assert [ids_of(o) for o in batch] == [ids_of(o) for o in llm.generate(PROMPTS, one)]
    templated = chat_ids(llm.tokenizer, MESSAGES)
    assert llm.chat(MESSAGES, params)[0].outputs[1].token_ids == alone(templated, 1)


def test_greedy_n_gives_identical_outputs(llm):
    greedy = ids_of(llm.generate(TEXT, SamplingParams(max_tokens=8)))
    out = llm.generate(TEXT, SamplingParams(max_tokens=8, n=3))
    assert [c.token_ids for c in out.outputs] == [greedy] * 3 and [c.index for c in out.outputs] == [0, 1, 2]
    out.outputs[1].token_ids.append(-1)  # copies, not one shared object
    assert out.outputs[0].token_ids == greedy


def test_generate_async_refuses_n(llm):
    with pytest.raises(ValueError) as exc:
        llm.generate_async(TEXT, SamplingParams(n=2))
    one_line_naming(exc.value, "n=2")
    with pytest.raises(TypeError, match="one prompt"):
        llm.generate_async([TEXT, TEXT])


def test_ignore_eos_runs_to_max_tokens(llm):
    eos = llm.default_end_id
    out = llm.generate(TEXT, SamplingParams(max_tokens=20, ignore_eos=True))
    assert len(ids_of(out)) == 20 and out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="ignore_eos=True and end_id"):
        SamplingParams(ignore_eos=True, end_id=eos)
    with pytest.raises(TypeError, match="ignore_eos"):
        SamplingParams(ignore_eos=1)


def test_chat_without_a_template_is_refused(llm, monkeypatch):
    monkeypatch.setattr(llm.tokenizer, "chat_template", None)
    with pytest.raises(ValueError) as exc:
        llm.chat(MESSAGES)
    one_line_naming(exc.value, "chat template")
