"""Every script's parser: each option has a one-line help, --help shows defaults, and
abbreviations are refused (``--max_tokens`` must never become ``--max_tokens_in_paged_kv_cache``)."""
from __future__ import annotations

import argparse
import importlib.util

import pytest

from tests.bench import load_bench


def _bench(name: str) -> argparse.ArgumentParser:
    return load_bench(name).build_parser()


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from promptlookup.cli import build, convert, ngram_cache, quickstart, run, serve, summarize
    from promptlookup.drafting.native import build as native_build
    from promptlookup.evaluation import grounded_prompts

    parsers = {
        "run.py": run.build_parser(),
        "summarize.py": summarize.build_parser(),
        "convert_checkpoint.py": convert.build_parser(),
        "build.sh": build.build_parser(),
        "ngram_cache": ngram_cache.build_parser(),
        "native.build": native_build.build_parser(),
        "grounded_prompts": grounded_prompts.build_parser(),
        "serve.py": serve.build_parser(),
        "quickstart_advanced.py": quickstart.build_parser(),
        "bench_drafting": _bench("bench_drafting"),
    }
    if importlib.util.find_spec("torch") is not None:
        parsers["bench_runtime"] = _bench("bench_runtime")
        parsers["bench_trees"] = _bench("bench_trees")
        parsers["bench_scale"] = _bench("bench_scale")
        parsers["bench_gpu_quant"] = _bench("bench_gpu_quant")
        parsers["bench_kernels"] = _bench("bench_kernels")
        parsers["bench_cpu_routes"] = _bench("bench_cpu_routes")
        parsers["bench_llamacpp"] = _bench("bench_llamacpp")
        parsers["bench_limit"] = _bench("bench_limit")
        parsers["bench_attention"] = _bench("bench_attention")
    for action in list(parsers["ngram_cache"]._actions):  # the subcommands' own parsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parsers[f"ngram_cache {name}"] = sub
    return parsers


PARSERS = _parsers()


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_option_has_help_and_abbreviations_are_refused(name):
    parser = PARSERS[name]
    assert parser.allow_abbrev is False, name
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        text = (action.help or "").strip()
        assert text and "\n" not in text, f"{name}: {action.option_strings or action.dest} has no one-line help"


@pytest.mark.parametrize("name", [n for n in PARSERS if not n.startswith(("native", "grounded"))])
def test_help_shows_every_default(name):
    parser = PARSERS[name]
    text = parser.format_help()
    shown = 0
    for action in parser._actions:
        if not action.option_strings or action.required or action.default is argparse.SUPPRESS:
            continue
        help_text = parser._get_formatter()._get_help_string(action)
        assert "default" in help_text.lower(), f"{name}: {action.option_strings[0]} does not show its default"
        shown += "(default: " in help_text
    assert " ".join(text.split()).count("(default: ") >= shown  # help lines wrap


@pytest.mark.parametrize("name, prefix", [("run.py", "--max_tokens"), ("summarize.py", "--max_in"),
                                          ("summarize.py", "--sweep_m")])
def test_a_prefix_of_a_long_flag_is_refused(name, prefix, capsys):
    with pytest.raises(SystemExit) as exc:
        PARSERS[name].parse_args([prefix, "60"])
    assert exc.value.code == 2
    assert f"unrecognized arguments: {prefix} 60" in capsys.readouterr().err


def test_scripts_and_library_share_the_workflow_and_block_reuse_defaults():
    """One set of defaults (promptlookup.defaults): v2 and block reuse on, for the scripts'
    flags and the library's signatures alike; --no-kv_cache_enable_block_reuse turns reuse off."""
    import inspect

    from promptlookup.api import KvCacheConfig
    from promptlookup.decoding import generate
    from promptlookup.defaults import DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE, DEFAULT_WORKFLOW
    from promptlookup.evaluation.pipeline import EvalSettings
    from promptlookup.runtime.torch_runner import TorchRunner

    assert (DEFAULT_WORKFLOW, DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE) == ("v2", True)
    assert inspect.signature(generate).parameters["workflow"].default == DEFAULT_WORKFLOW
    assert inspect.signature(TorchRunner).parameters["kv_cache_enable_block_reuse"].default is True
    assert KvCacheConfig().enable_block_reuse is True
    assert (EvalSettings().workflow, EvalSettings().kv_cache_enable_block_reuse) == (DEFAULT_WORKFLOW, True)
    for name in ("run.py", "summarize.py"):
        args = PARSERS[name].parse_args([])
        assert (args.workflow, args.kv_cache_enable_block_reuse) == (DEFAULT_WORKFLOW, True), name
        assert PARSERS[name].parse_args(["--kv_cache_enable_block_reuse"]).kv_cache_enable_block_reuse is True
        assert PARSERS[name].parse_args(["--no-kv_cache_enable_block_reuse"]).kv_cache_enable_block_reuse is False
    for name in ("serve.py", "quickstart_advanced.py"):
        assert PARSERS[name].parse_args([]).kv_cache_enable_block_reuse is True, name
        assert PARSERS[name].parse_args(["--no-kv_cache_enable_block_reuse"]).kv_cache_enable_block_reuse is False
