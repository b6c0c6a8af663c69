"""``summarize.py``: ROUGE and speed on CNN/DailyMail, our engine beside Hugging Face.

Flags follow TensorRT-LLM's ``examples/summarize.py`` (``--test_trt_llm`` evaluates the
engine in ``--engine_dir`` on whichever backend it was built for). The work itself lives
in :mod:`promptlookup.evaluation`; this module parses flags, prints and writes results.

Exit codes: 0 success; 1 ``--check_accuracy`` failed (one line on stderr); 2 bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Collection

from ..errors import UserError
from ..fsutil import atomic_output_dir, atomic_write_json, ensure_writable
from ..threads import configure_threads
from .args import (
    ArgumentParser,
    add_common_args,
    device_ids_from_args,
    draft_from_args,
    drafter_options_from_args,
    lookahead_from_args,
    finite_float,
    require_lookup_config,
    sampling_from_args,
)

SWEEP_TABLE_HEADERS = ("setting", "tok/s", "speedup", "tok/step", "accepted/drafted", "identical", "R-1")


def build_parser() -> ArgumentParser:
    from ..evaluation.hf_baseline import DATA_TYPES
    from ..evaluation.prompts import TRUNCATIONS
    from ..evaluation.sweep import DEFAULT_SWEEP_K, DEFAULT_SWEEP_N, SWEEP_MODES

    parser = ArgumentParser(prog="summarize.py", description=__doc__.split("\n\n")[0].replace("``", ""))
    g = parser.add_argument_group("what to evaluate")
    g.add_argument("--test_trt_llm", action="store_true",
                   help="evaluate the engine in --engine_dir (plain, and prompt lookup with --prompt_lookup_config)")
    g.add_argument("--test_hf", action="store_true",
                   help="evaluate the Hugging Face model (plain, and HF prompt lookup with --prompt_lookup_config)")
    g.add_argument("--hf_model_dir", default=None,
                   help="HF model dir, or a converted checkpoint/engine dir; default: the tokenizer/engine dir")
    g.add_argument("--data_type", default="auto", choices=DATA_TYPES,
                   help="dtype of the HF model; auto: float32 on CPU, float16 on GPU")
    g.add_argument("--hf_device", default="auto", help="device of the HF model: auto (cuda if available), cpu, cuda, cuda:N")
    g = parser.add_argument_group("data")
    g.add_argument("--dataset_path", default=None,
                   help="local JSON/JSONL/Parquet/CSV with 'article' and 'highlights' columns; "
                        "default: the hub's cnn_dailymail 3.0.0 test split")
    g.add_argument("--dataset_dir", default=None,
                   help="TensorRT-LLM's name: a data file as for --dataset_path, or a folder holding one .jsonl file")
    g.add_argument("--eval_task", default="summarize", help="TensorRT-LLM's task name; only summarize is supported")
    g.add_argument("--batch_size", type=int, default=1, help="articles decoded together")
    g.add_argument("--max_ite", type=int, default=20, help="number of batches; the first one is a warm-up (untimed)")
    g.add_argument("--max_input_length", type=int, default=923, help="prompt tokens kept per article")
    g.add_argument("--truncation", choices=TRUNCATIONS, default="text",
                   help="text: keep the first tokens of article+TL;DR (TensorRT-LLM); article: shorten the article only")
    g.add_argument("--output_len", type=int, default=100, help="new tokens per article")
    g = parser.add_argument_group("accuracy")
    g.add_argument("--check_accuracy", action="store_true",
                   help="exit 1 unless every contender's ROUGE-1 is above the threshold")
    g.add_argument("--tensorrt_llm_rouge1_threshold", type=finite_float, default=15.0,
                   help="--check_accuracy: the lowest acceptable ROUGE-1")
    g = parser.add_argument_group("parameter sweep")
    g.add_argument("--sweep", action="store_true", help="run a grid of prompt-lookup settings with our engine")
    g.add_argument("--sweep_k", default=",".join(map(str, DEFAULT_SWEEP_K)), help="prompt_lookup_num_tokens values")
    g.add_argument("--sweep_n", default=",".join(map(str, DEFAULT_SWEEP_N)), help="max_matching_ngram_size values")
    g.add_argument("--sweep_modes", default=",".join(SWEEP_MODES), help=f"subset of {','.join(SWEEP_MODES)}")
    g.add_argument("--sweep_lookahead", default="",
                   help='Lookahead points added to the sweep, as "[[W,N,G],...]", e.g. "[[4,3,4],[8,4,4]]" (run with --workflow)')
    g.add_argument("--sweep_dir", default=None,
                   help="where sweep.json, sweep.csv and sweep.png are written "
                        "(default: OUTPUT_DIR/summarize_sweep, else outputs/summarize_sweep)")
    parser.add_argument("--output_dir", default=None,
                        help="TensorRT-LLM's flag: write OUTPUT_DIR/summarize.json (unless --output_json is given) "
                             "and the sweep's folder there (unless --sweep_dir is); refused when that leaves it nothing")
    add_common_args(parser)
    return parser


# Which runs read which flags (dest -> flag), after evaluation.pipeline.contender_specs and the
# sweep in evaluation.pipeline.evaluate. A flag none of the runs that are on reads is refused.
#
# Every run of our engine (--test_trt_llm's contenders, the sweep's plain run and points):
ENGINE_ONLY_FLAGS = {
    "device": "--device", "max_tokens_in_paged_kv_cache": "--max_tokens_in_paged_kv_cache",
    "kv_cache_free_gpu_memory_fraction": "--kv_cache_free_gpu_memory_fraction", "kv_cache_dtype": "--kv_cache_dtype",
    "enable_chunked_context": "--enable_chunked_context", "kv_cache_enable_block_reuse": "--kv_cache_enable_block_reuse",
    "cpu_weight_copies": "--cpu_weight_copies", "torch_compile": "--torch_compile",
    "cuda_graph_mode": "--cuda_graph_mode", "backend": "--backend", "workflow": "--workflow",
    "draft_length_policy": "--draft_length_policy",
}
# Drafter options that our lookup contender (--test_trt_llm with --prompt_lookup_config) and every
# sweep point read (the sweep needs no --prompt_lookup_config for them); Hugging Face reads none.
SWEEP_DRAFT_FLAGS = {
    "is_keep_all": "--is_keep_all", "is_use_oldest": "--is_use_oldest", "is_public_pool": "--is_public_pool",
    "pool_rules": "--pool_rules", "prompt_lookup_min_ngram": "--prompt_lookup_min_ngram",
    "prompt_lookup_candidates": "--prompt_lookup_candidates", "ngram_static_cache": "--ngram_static_cache",
    "ngram_pool_max_patterns": "--ngram_pool_max_patterns", "public_text_max_tokens": "--public_text_max_tokens",
    "max_concurrency": "--max_concurrency",
}
# Read by --test_trt_llm's contenders only: a sweep point sets its drafter and adaptive drafting
# itself (--sweep_modes), leaves a dynamic cache out and has its own Lookahead points
# (--sweep_lookahead); a draft_len_schedule is tied to --prompt_lookup_config's k.
CONTENDER_ONLY_FLAGS = {
    "drafter_mode": "--drafter_mode", "adaptive_draft": "--adaptive_draft",
    "ngram_dynamic_cache": "--ngram_dynamic_cache", "draft_len_schedule": "--draft_len_schedule",
    "lookahead_config": "--lookahead_config",
}
# k and n: read by the lookup contenders of --test_trt_llm and --test_hf (the sweep has --sweep_k, --sweep_n).
LOOKUP_CONFIG_FLAGS = {"prompt_lookup_config": "--prompt_lookup_config", "ngram_config": "--ngram_config"}
SWEEP_OWN = ("the sweep takes k and n from --sweep_k/--sweep_n, its drafters from --sweep_modes and its Lookahead "
             "points from --sweep_lookahead")
HF_READS = "Hugging Face's prompt lookup reads only --prompt_lookup_config's k and n"


def refuse_unread_flags(args: argparse.Namespace, given: Collection[str]) -> None:
    """Refuse flags whose reader is off (one line): the Hugging Face model's without
    ``--test_hf``, the sweep's without ``--sweep``, the threshold without ``--check_accuracy``,
    the engine's without ``--test_trt_llm`` or ``--sweep``, our lookup contender's own without
    ``--test_trt_llm``, and ``--prompt_lookup_config`` without a lookup contender."""
    engine, hf, sweep = args.test_trt_llm, args.test_hf, args.sweep
    names = {**ENGINE_ONLY_FLAGS, **SWEEP_DRAFT_FLAGS, **CONTENDER_ONLY_FLAGS, **LOOKUP_CONFIG_FLAGS}
    for on, dests, switch in (
        (hf, ("hf_model_dir", "hf_device", "data_type"), "--test_hf"),
        (sweep, ("sweep_k", "sweep_n", "sweep_modes", "sweep_lookahead", "sweep_dir"), "--sweep"),
        (args.check_accuracy, ("tensorrt_llm_rouge1_threshold",), "--check_accuracy"),
        (engine or sweep, (*ENGINE_ONLY_FLAGS, *SWEEP_DRAFT_FLAGS), "--test_trt_llm or --sweep"),
        (engine, tuple(CONTENDER_ONLY_FLAGS), "--test_trt_llm"),
        (engine or hf, tuple(LOOKUP_CONFIG_FLAGS), "--test_trt_llm or --test_hf"),
    ):
        stray = [names.get(d, "--" + d) for d in dests if d in given]
        if not on and stray:
            one = len(stray) == 1
            off = "which are off; add one" if " or " in switch else "which is off; add it"
            why = (f" ({SWEEP_OWN})" if sweep and switch.startswith("--test_trt_llm")
                   else f" ({HF_READS})" if hf and switch.startswith("--test_trt_llm") else "")
            raise UserError(f"{', '.join(stray)} {'is' if one else 'are'} read only with {switch}, {off} or drop "
                            f"{'it' if one else 'them'}{why}")


def sweep_draft_from_args(args: argparse.Namespace, draft: Any):
    """The drafter options every sweep point starts from, or None without ``--sweep``:
    ``draft`` (the lookup contender's) when given, else :data:`SWEEP_DRAFT_FLAGS` on their own."""
    if not args.sweep:
        return None
    if draft is not None:
        return draft
    from ..drafting.base import DraftConfig

    return DraftConfig(**drafter_options_from_args(args, needs_lookup_config=False))


def settings_from_args(args: argparse.Namespace, given: Collection[str] = frozenset()):
    from ..evaluation.pipeline import EvalSettings
    from ..evaluation.sweep import parse_int_list, parse_modes

    draft = draft_from_args(args)
    return EvalSettings(
        engine_dir=args.engine_dir,
        tokenizer_dir=args.tokenizer_dir,
        hf_model_dir=args.hf_model_dir,
        test_engine=args.test_trt_llm,
        test_hf=args.test_hf,
        dataset_path=dataset_from_args(args),
        batch_size=args.batch_size,
        max_ite=args.max_ite,
        max_input_length=args.max_input_length,
        output_len=args.output_len,
        draft=draft,
        sweep_draft=sweep_draft_from_args(args, draft),
        device_ids=device_ids_from_args(args),
        kv_cache_enable_block_reuse=args.kv_cache_enable_block_reuse,
        max_tokens_in_paged_kv_cache=args.max_tokens_in_paged_kv_cache,
        kv_cache_free_gpu_memory_fraction=args.kv_cache_free_gpu_memory_fraction,
        kv_cache_dtype=args.kv_cache_dtype,
        enable_chunked_context=args.enable_chunked_context,
        workflow=args.workflow,
        draft_length_policy=args.draft_length_policy,
        use_chat_template=args.use_chat_template,
        truncation=args.truncation,
        sampling=sampling_from_args(args, given),
        end_id=args.end_id,
        data_type=args.data_type,
        hf_device=None if args.hf_device == "auto" else args.hf_device,
        device=None if args.device == "auto" else args.device,
        cuda_graph_mode=args.cuda_graph_mode,
        cpu_weight_copies=args.cpu_weight_copies,
        compile_mode=args.torch_compile,
        random_seed=args.random_seed,
        sweep=args.sweep,
        sweep_k=parse_int_list(args.sweep_k, "--sweep_k"),
        sweep_n=parse_int_list(args.sweep_n, "--sweep_n"),
        sweep_modes=parse_modes(args.sweep_modes),
        lookahead=lookahead_from_args(args),
        sweep_lookahead=parse_lookahead_list(args.sweep_lookahead),
        backend=args.backend,
    )


def dataset_from_args(args: argparse.Namespace) -> str | None:
    """``--dataset_path``, or ``--dataset_dir`` (TensorRT-LLM's name) resolved to its file."""
    from ..evaluation.dataset import dataset_file_in

    if args.dataset_dir is None:
        return args.dataset_path
    resolved = dataset_file_in(args.dataset_dir)
    if args.dataset_path is not None and Path(args.dataset_path).resolve() != Path(resolved).resolve():
        raise UserError(f"--dataset_path {args.dataset_path} and --dataset_dir {args.dataset_dir} "
                        f"({resolved}) name different data; give one of them")
    return resolved


def resolve_outputs(args: argparse.Namespace) -> None:
    """Apply ``--eval_task`` and ``--output_dir`` to the argument namespace (in place).

    ``--output_dir`` names the default place of the results JSON and the sweep's folder;
    with both named elsewhere (``--output_json``, and ``--sweep_dir`` or no ``--sweep``) it
    would write nothing, so it is refused."""
    if args.eval_task != "summarize":
        raise UserError(f"--eval_task {args.eval_task} is not supported; only summarize is (drop the flag)")
    out = Path(args.output_dir) if args.output_dir is not None else None
    if out is not None and args.output_json is not None and not (args.sweep and args.sweep_dir is None):
        others = "--output_json names the results file" + (" and --sweep_dir the sweep's folder" if args.sweep else "")
        raise UserError(f"--output_dir {args.output_dir} would hold nothing: {others}; drop --output_dir, or drop "
                        "--output_json to write OUTPUT_DIR/summarize.json")
    if out is not None and out.exists() and not out.is_dir():
        raise UserError(f"--output_dir {args.output_dir} exists and is not a directory; choose another path")
    if args.output_json is None and out is not None:
        args.output_json = str(out / "summarize.json")
    if args.sweep_dir is None:
        args.sweep_dir = str(out / "summarize_sweep") if out is not None else "outputs/summarize_sweep"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _sweep_table(result: Any) -> str:
    from ..evaluation.report import format_table

    def row(label: str, r: dict[str, Any]) -> list[str]:
        acc = f"{r['accepted']}/{r['drafted']}" if r.get("drafted") else "-"
        if r.get("acceptance_rate") is not None:
            acc += f" ({100 * r['acceptance_rate']:.0f}%)"
        return [label, "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.1f}",
                "-" if r.get("speedup") is None else f"{r['speedup']:.2f}x",
                "-" if r.get("tokens_per_step") is None else f"{r['tokens_per_step']:.2f}", acc,
                "-" if r.get("compared") is None else f"{r['identical']}/{r['compared']}", f"{r['rouge1']:.2f}"]

    base = dict(result.sweep_baseline, speedup=1.0)
    rows = [row("plain (baseline)", base)] + [row(r["label"], r) for r in result.sweep_rows]
    return format_table(SWEEP_TABLE_HEADERS, rows)


def _write_sweep(result: Any, directory: str, num_threads: int) -> None:
    from ..evaluation.plot import sweep_plot_png
    from ..evaluation.report import to_csv
    from ..evaluation.sweep import SWEEP_COLUMNS

    payload = dict(result.to_dict()["sweep"], num_threads=num_threads)
    s = result.settings
    title = (f"prompt lookup sweep: {len(result.articles)} articles, batch {s.batch_size}, "
             f"{s.output_len} new tokens, workflow {s.workflow}, {num_threads} CPU thread(s)")
    png = sweep_plot_png(result.sweep_rows, best=result.sweep_best, title=title)
    from ..evaluation.pipeline import SWEEP_FILES, SWEEP_KIND

    with atomic_output_dir(directory, SWEEP_KIND, flag="--sweep_dir", legacy_names=SWEEP_FILES) as tmp:
        atomic_write_json(tmp / "sweep.json", payload)
        (tmp / "sweep.csv").write_text(to_csv(result.sweep_rows, SWEEP_COLUMNS))
        (tmp / "sweep.png").write_bytes(png)


def main(argv: list[str] | None = None) -> int:
    from ..evaluation.pipeline import ensure_sweep_dir, evaluate
    from ..evaluation.report import check_accuracy, contenders_table
    from ..evaluation.sweep import deploy_hint

    parser = build_parser()
    args = parser.parse_args(argv)
    # Flags no run reads first (their message names the run to add), then drafting flags
    # without --prompt_lookup_config: the sweep reads --workflow, --draft_length_policy and the
    # drafter options of SWEEP_DRAFT_FLAGS without it.
    refuse_unread_flags(args, parser.given)
    require_lookup_config(args, parser.given,
                          allowed={"workflow", "draft_length_policy", *SWEEP_DRAFT_FLAGS} if args.sweep else ())
    resolve_outputs(args)
    settings = settings_from_args(args, parser.given)
    if args.output_json:  # writable, and not one of the run's inputs (the data set, a file of the engine)
        ensure_writable(args.output_json, "--output_json", inputs=[
            (f"--{name}", getattr(args, name, None)) for name in ("engine_dir", "tokenizer_dir", "hf_model_dir",
                                                                  "dataset_path", "dataset_dir", "ngram_static_cache",
                                                                  "ngram_dynamic_cache")])
    if settings.sweep:
        ensure_sweep_dir(args.sweep_dir)
    if (settings.test_engine or settings.sweep) and settings.engine_dir:
        from ..engine.config import read_engine_config

        read_engine_config(settings.engine_dir)  # a missing or broken engine is refused before torch loads (seconds)
    num_threads = configure_threads(args.num_threads)
    result = evaluate(settings, log=_log)
    if settings.max_ite == 1:
        _log("note: --max_ite 1 decodes only the warm-up batch, which is scored but not timed: no speeds were "
             "measured; pass --max_ite 2 or more for them")

    print(f"\n{len(result.articles)} articles, batch size {settings.batch_size}, up to {settings.output_len} new tokens, "
          f"{num_threads} CPU thread(s); "
          "the first batch of each contender is a warm-up: scored, not timed")
    print(contenders_table(result.reports))
    if result.engine_vs_hf is not None:
        same = result.engine_vs_hf
        note = "" if settings.sampling.greedy else " (sampling: differences are expected)"
        print(f"ours plain vs hf plain: {same['identical']}/{same['compared']} outputs token-identical{note}")
    if settings.sweep:
        print("\nprompt-lookup sweep (our engine, speedup over our plain decoding):")
        print(_sweep_table(result))
        best = result.sweep_best
        if best is None:
            print("best setting: none (no timed batches)")
        elif best["speedup"] <= 1.0:
            print(f"best setting: plain decoding (the fastest grid point, {best['label']}, is {best['speedup']:.2f}x)")
        else:
            print(f"best setting: {best['label']} at {best['speedup']:.2f}x -> "
                  f"{deploy_hint(best, settings.device_ids or [0], settings.workflow)}")
        _write_sweep(result, args.sweep_dir, num_threads)
        print(f"sweep table and plot written to {args.sweep_dir}/ (sweep.json, sweep.csv, sweep.png)")

    verdict = check_accuracy(result.reports, args.tensorrt_llm_rouge1_threshold) if args.check_accuracy else None
    if args.output_json:
        payload = result.to_dict()
        payload["num_threads"] = num_threads
        if (settings.test_engine or settings.sweep) and settings.engine_dir:
            from ..engine.config import read_engine_config, weights_of

            payload["engine_weights"] = weights_of(read_engine_config(settings.engine_dir).pretrained)
        payload["accuracy_check"] = None if verdict is None else verdict.to_dict()
        atomic_write_json(args.output_json, payload)
        print(f"results written to {args.output_json}")
    if verdict is not None:
        if not verdict.passed:
            print(f"error: {verdict.message()}", file=sys.stderr)
            return 1
        print(verdict.message())
    return 0


if __name__ == "__main__":  # pragma: no cover
    from ..errors import run_cli

    run_cli(main)


def parse_lookahead_list(text: str) -> list:
    """``"[[4,3,4],[8,4,4]]"`` -> LookaheadConfigs (empty text: none); bad input is one line."""
    from ..decoding.lookahead import LookaheadConfig
    from ..literals import parse_list_literal

    if not text.strip():
        return []
    hint = 'expected a list of [W,N,G], e.g. "[[4,3,4],[8,4,4]]"'
    value = parse_list_literal(text, "--sweep_lookahead", hint)
    if not all(isinstance(v, (list, tuple)) and len(v) == 3 for v in value):
        raise UserError(f"--sweep_lookahead {text!r}: {hint}")
    return [LookaheadConfig(*v) for v in value]
