"""serve.py's flags: the LLM they build, and bad values as one-line errors."""
from __future__ import annotations

import pytest

from promptlookup.cli.serve import api_key, build_llm, main, parse_args
from promptlookup.errors import UserError


def test_flags_build_the_configured_llm(tiny_engine_dir):
    args = parse_args(["--engine_dir", str(tiny_engine_dir), "--prompt_lookup_config", "[6,3,[0]]",
                       "--prompt_lookup_min_ngram", "2", "--no-is_public_pool", "--draft_token_budget", "9"])
    llm = build_llm(args)
    try:
        cfg = llm.drafter.config
        assert (cfg.prompt_lookup_num_tokens, cfg.max_matching_ngram_size, cfg.min_matching_ngram_size) == (6, 3, 2)
        assert not cfg.is_public_pool and llm.scheduler.token_budget == 9
    finally:
        llm.shutdown()


def test_plain_decoding_without_prompt_lookup_config(tiny_engine_dir):
    llm = build_llm(parse_args(["--engine_dir", str(tiny_engine_dir)]))
    try:
        assert llm.drafter is None and llm.scheduler.token_budget == 1
    finally:
        llm.shutdown()


@pytest.mark.parametrize("argv,match", [
    (["--prompt_lookup_config", "[0,2,[0]]"], "prompt_lookup_config"),
    (["--port", "70000"], "port"),
    (["--engine_dir", "/nonexistent/engine", "--port", "0"], "does not exist"),
    (["--shutdown_timeout", "-1"], "shutdown_timeout"),
    (["--max_waiting_requests", "-1"], "max_waiting_requests"),
    (["--max_request_bytes", "0"], "max_request_bytes"),
    # drafting flags without speculation, accepted and ignored before
    (["--drafter_mode", "longest"], "--drafter_mode applies only to prompt lookup, which is off"),
    (["--draft_length_policy", "full"], "--draft_length_policy applies only to prompt lookup"),
    (["--prompt_lookup_min_ngram", "3"], "--prompt_lookup_min_ngram applies only to prompt lookup"),
    (["--prompt_lookup_config", "[10,2]", "--drafter_mode", "longest", "--is_keep_all"],
     "--is_keep_all applies to --drafter_mode pool, not 'longest'"),
    (["--draft_token_budget", "4"], "--draft_token_budget sizes prompt lookup's chain drafts, which are off"),
    (["--lookahead_config", "[2,3,2]", "--draft_token_budget", "4"], "--draft_token_budget sizes prompt lookup's"),
])
def test_bad_values_are_user_errors(argv, match):
    with pytest.raises(UserError, match=match):
        main(argv)


def test_unknown_flag_exits_2():
    with pytest.raises(SystemExit) as exc:
        parse_args(["--bogus"])
    assert exc.value.code == 2


def test_lookahead_config_builds_a_lookahead_llm(tiny_engine_dir):
    llm = build_llm(parse_args(["--engine_dir", str(tiny_engine_dir), "--lookahead_config", "[2,3,2]"]))
    try:
        assert llm.scheduler.lookahead is not None and llm.scheduler.lookahead.triple == (2, 3, 2)
        out = llm.generate([1, 2, 3, 1, 2, 3, 1, 2])
        assert out.outputs[0].token_ids
    finally:
        llm.shutdown()
    with pytest.raises(UserError, match="not both"):
        build_llm(parse_args(["--engine_dir", str(tiny_engine_dir), "--lookahead_config", "[2,3,2]",
                              "--prompt_lookup_config", "[4,2,[0]]"]))


def test_run_py_flags_and_llama_cpp_aliases_are_accepted():
    args = parse_args(["--num_threads", "1", "--lookup-cache-static", "s.bin", "--lookup-cache-dynamic", "d.bin",
                       "--served_model_name", "main", "alias", "--api_key", "k", "--shutdown_timeout", "2.5",
                       "--max_waiting_requests", "3", "--max_request_bytes", "4096"])
    assert (args.num_threads, args.ngram_static_cache, args.ngram_dynamic_cache) == (1, "s.bin", "d.bin")
    assert args.served_model_name == ["main", "alias"] and args.api_key == "k" and args.shutdown_timeout == 2.5
    assert (args.max_waiting_requests, args.max_request_bytes) == (3, 4096)


def test_num_threads_is_checked_before_anything_loads():
    with pytest.raises(UserError, match="--num_threads"):
        main(["--num_threads", "0", "--port", "0"])


def test_api_key_comes_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.delenv("PROMPTLOOKUP_API_KEY", raising=False)
    assert api_key(parse_args([])) is None
    monkeypatch.setenv("PROMPTLOOKUP_API_KEY", "from-env")
    assert api_key(parse_args([])) == "from-env"
    assert api_key(parse_args(["--api_key", "flag"])) == "flag"
