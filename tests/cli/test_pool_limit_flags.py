"""--ngram_pool_max_patterns and --public_text_max_tokens on serve.py and run.py: honoured
with prompt lookup, refused (one line, exit 2) without it or for the other mode."""
from __future__ import annotations

import pytest

from promptlookup.cli.args import draft_from_args
from promptlookup.cli.run import parse_args as run_parse_args
from promptlookup.cli.serve import build_llm, main, parse_args
from promptlookup.errors import UserError


def test_serve_flag_reaches_the_public_pool(tiny_engine_dir):
    args = parse_args(["--engine_dir", str(tiny_engine_dir), "--prompt_lookup_config", "[4,2,[0]]",
                       "--ngram_pool_max_patterns", "123"])
    llm = build_llm(args)
    try:
        assert llm.drafter.config.ngram_pool_max_patterns == 123
        assert llm.drafter.mode.public_pool.max_patterns == 123
    finally:
        llm.shutdown()


@pytest.mark.parametrize("argv,match", [
    (["--ngram_pool_max_patterns", "5"], "--ngram_pool_max_patterns applies only to prompt lookup"),
    (["--public_text_max_tokens", "5"], "--public_text_max_tokens applies only to prompt lookup"),
    (["--prompt_lookup_config", "[4,2,[0]]", "--public_text_max_tokens", "5"], "longest mode only"),
    (["--prompt_lookup_config", "[4,2,[0]]", "--ngram_pool_max_patterns", "0"], "positive integer"),
])
def test_serve_refuses_what_it_cannot_honour(argv, match):
    with pytest.raises(UserError, match=match):
        main(argv + ["--engine_dir", "/nonexistent/engine", "--port", "0"])


def test_run_flags_build_the_draft_config():
    args = run_parse_args(["--prompt_lookup_config", "[4,2,[0]]", "--drafter_mode", "longest",
                           "--public_text_max_tokens", "77", "--input_text", "hi"])
    cfg = draft_from_args(args)
    assert cfg.public_text_max_tokens == 77 and cfg.public_max_tokens() == 77
    assert cfg.ngram_pool_max_patterns is None
