"""``run.py``: generate from a built engine, with prompt-lookup speculative decoding."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from dataclasses import asdict
from typing import Any

from ..errors import UserError
from ..engine.config import check_end_id
from ..fsutil import atomic_write_json, ensure_writable
from .args import (
    ArgumentParser,
    add_common_args,
    check_ngram_cache_paths,
    device_ids_from_args,
    draft_from_args,
    kv_cache_from_args,
    lookahead_from_args,
    require_lookup_config,
    runtime_from_args,
    sampling_from_args,
)
from .inputs import check_input_file, check_prompt_sources, collect_prompts
from .run_flags import (
    add_run_flags,
    check_run_flags,
    configure_logging,
    log,
    release_logs,
    sampling_with_run_flags,
    truncate_prompts,
)
from .token_outputs import output_id_rows, write_csv, write_npy
from ..stream_output import StreamPrinter, add_color_argument, color_mode, colorize, decode_text


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="run.py", description="Generate with prompt-lookup speculative decoding.")
    p.add_argument("--input_text", action="append", default=None, help="a prompt; repeat for a batch")
    p.add_argument("--input_file", default=None, help=".txt, .json, .csv or .npy (see the README)")
    p.add_argument("--max_output_len", type=int, default=100, help="new tokens per prompt at most")
    p.add_argument("--streaming", action="store_true", help="print text as it is accepted")
    p.add_argument("--hf_model_dir", default=None, help="TensorRT-LLM backend, v2 workflow: the Hugging Face model")
    add_color_argument(p)
    add_common_args(p)
    add_run_flags(p)
    p.add_argument("--output_csv", default=None, help="write prompt+output token ids as CSV (TensorRT-LLM's layout)")
    p.add_argument("--output_npy", default=None,
                   help="write prompt+output token ids as an int32 .npy (TensorRT-LLM's layout)")
    return p


def parse_args(argv: list[str] | None):
    return build_parser().parse_args(argv)


def summarize_stats(results: list[Any]) -> dict[str, Any]:
    generated = sum(r.generated_tokens for r in results)
    by_source: dict[str, int] = {}
    for r in results:
        for k, v in r.accepted_by_source.items():
            by_source[k] = by_source.get(k, 0) + v
    steps = sum(r.steps for r in results)
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    return {
        "generated_tokens": generated,
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_step": generated / steps if steps else 0.0,
        "tree_tokens": sum(r.tree_tokens for r in results),
        "accepted_by_source": by_source,
    }


def main(argv: list[str] | None = None) -> int:
    begun = time.perf_counter()  # set-up time (loading included) is reported apart from generation
    parser = build_parser()
    args = parser.parse_args(argv)
    held = configure_logging(args.log_level)
    ok = False
    try:
        code = _run(args, parser.given, begun)
        ok = True
        return code
    finally:
        release_logs(held, ok)


def check_outputs(args: Any) -> None:
    """Before any work: each output file can be written, none is another output, and none
    would replace what the run reads (the engine folder's files, the prompt file, a cache)."""
    outputs = [(flag, path) for flag, path in (("--output_csv", args.output_csv), ("--output_npy", args.output_npy),
                                               ("--output_json", args.output_json)) if path]
    inputs = [("--engine_dir", args.engine_dir), ("--tokenizer_dir", args.tokenizer_dir),
              ("--input_file", args.input_file), ("--hf_model_dir", args.hf_model_dir),
              ("--ngram_static_cache", args.ngram_static_cache), ("--ngram_dynamic_cache", args.ngram_dynamic_cache)]
    for i, (flag, path) in enumerate(outputs):
        ensure_writable(path, flag, inputs=inputs)
        for other_flag, other in outputs[:i]:
            if Path(path).resolve() == Path(other).resolve():
                raise UserError(f"{flag} {path} is also {other_flag}; name different files")


def _run(args: Any, given: Any, begun: float) -> int:
    require_lookup_config(args, given)
    check_run_flags(args)
    check_prompt_sources(args.input_text, args.input_file)  # the prompts are read after loading
    check_outputs(args)
    check_ngram_cache_paths(args)
    sampling = sampling_from_args(args, given, seed="random_seed")
    draft = draft_from_args(args)
    if draft is not None:
        from ..drafting.drafter import check_candidates

        check_candidates(draft, args.workflow)  # before loading (the drafter checks it again)
    lookahead = lookahead_from_args(args)
    device_ids = device_ids_from_args(args)
    if args.max_output_len < 1:
        raise UserError(f"--max_output_len must be at least 1, got {args.max_output_len}")
    if args.input_file:
        check_input_file(args.input_file)
    kv_cache = kv_cache_from_args(args)
    runtime = runtime_from_args(args)  # threads included: load_runner applies them
    num_threads = runtime.num_threads

    from ..engine.config import read_engine_config, weights_of

    engine_cfg = read_engine_config(args.engine_dir)  # a missing or incomplete engine is reported first
    if args.end_id is not None:
        check_end_id(args.end_id, engine_cfg.limits.vocab_size)  # before torch loads (seconds)
    if "kv_cache_enable_block_reuse" in given and args.kv_cache_enable_block_reuse \
            and (engine_cfg.build.get("plugin_config") or {}).get("use_paged_context_fmha") is False:
        raise UserError(f"--kv_cache_enable_block_reuse: {args.engine_dir} was built with --use_paged_context_fmha "
                        "disable, which block reuse needs; rebuild it with enable, or drop the flag")

    from ..decoding import drafter_for, generate
    from ..engine.load import load_runner
    from ..runtime import load_tokenizer

    from ..drafting.concurrency import refuse_unrouted

    refuse_unrouted(draft, inside_tensorrt_llm=engine_cfg.backend == "trtllm" and args.workflow == "v2")
    if engine_cfg.backend == "trtllm" and "draft_length_policy" in given and args.draft_length_policy == "cost":
        raise UserError("--draft_length_policy cost needs a PyTorch engine's step-cost table; TensorRT-LLM verifies "
                        "every draft in full: pass --draft_length_policy full or drop it")

    tokenizer = load_tokenizer(args.tokenizer_dir or args.engine_dir)
    sampling = sampling_with_run_flags(sampling, args, tokenizer)
    runner = load_runner(
        args.engine_dir,
        runtime,
        kv_cache,
        device_ids=device_ids,
        enable_chunked_context=args.enable_chunked_context,
        hf_model_dir=args.hf_model_dir,
        backend=args.backend,
    )
    where = runner.describe()  # device, dtype, CUDA graphs, compile set-up
    log.info("loaded %s (%s engine, %s, %s)", args.engine_dir, type(runner).__name__,
             "TensorRT-LLM" if where["dtype"] is None else where["device"], where["dtype"] or "engine dtype")
    pool = getattr(runner, "pool", None)  # a PyTorch engine's KV pool, sized on load
    if pool is not None:
        log.info("KV cache: %d tokens, %s, %.1f MiB", pool.tokens, str(pool.dtype).removeprefix("torch."),
                 pool.nbytes / 2**20)
    if where["dtype"] is not None:
        import torch

        from ..runtime.device import slow_dtype_note

        note = slow_dtype_note(getattr(torch, where["dtype"]), where["device"])
        if note:
            print(f"note: {note}", file=sys.stderr)
    if draft is not None and runner.capabilities.own_speculation:  # TensorRT-LLM's engine and device rules
        runner.validate_lookup(draft.prompt_lookup_num_tokens, device_ids)  # type: ignore[attr-defined]
    vocab = runner.limits.vocab_size
    if len(tokenizer) > vocab:
        raise UserError(
            f"the tokenizer has {len(tokenizer)} tokens but the engine's vocabulary is {vocab}; "
            "pass the --tokenizer_dir that matches this engine"
        )
    end_id = args.end_id if args.end_id is not None else tokenizer.eos_token_id
    if end_id is None:
        raise UserError("the tokenizer defines no end-of-sequence token; pass --end_id")
    check_end_id(end_id, vocab)
    prompts = collect_prompts(args.input_text, args.input_file, tokenizer, args.use_chat_template, end_id)
    truncate_prompts(prompts, args.max_input_length, tokenizer)
    for i, p in enumerate(prompts):
        log.debug("prompt %d: %d tokens", i, len(p.ids))
    use_color = color_mode(args.color, sys.stdout)
    printer = StreamPrinter(tokenizer, sys.stdout, color=use_color, num_sequences=len(prompts)) if args.streaming else None

    # TensorRT-LLM (v2) drafts inside itself; persisted caches still need this side's drafter,
    # which knows the tokenizer, to run there (UserProvidedDecodingConfig).
    drafter = drafter_for(draft, runner.capabilities, workflow=args.workflow, end_id=end_id, tokenizer=tokenizer)

    start = time.perf_counter()
    results = generate(
        runner,
        [p.ids for p in prompts],
        max_new_tokens=args.max_output_len,
        end_id=end_id,
        sampling=sampling,
        draft=draft,
        workflow=args.workflow,
        on_step=printer.on_step if printer else None,
        drafter=drafter,
        draft_length_policy=args.draft_length_policy,
        lookahead=lookahead,
    )
    wall = time.perf_counter() - start
    if (draft is not None or lookahead is not None) and args.draft_length_policy == "cost" \
            and runner.capabilities.live_batch and runner.step_cost_table is None:
        print("note: this engine stores no step-cost table for this device, so every draft is verified in full; "
              "rebuild it with build.sh to measure one", file=sys.stderr)
    if drafter is not None and draft.dynamic_cache:
        drafter.save()
        print(f"updated the dynamic n-gram cache {draft.dynamic_cache}")
    texts = printer.finish() if printer else [decode_text(tokenizer, r.output_ids) for r in results]

    if not printer:
        for i, (p, r, text) in enumerate(zip(prompts, results, texts)):
            shown = p.text if p.text is not None else f"<{len(p.ids)} token ids>"
            print(f'Input [Text {i}]: "{shown if len(shown) <= 300 else shown[:300] + "..."}"')
            body = colorize(tokenizer, r.output_ids, r.draft_flags) if use_color else text
            print(f'Output [Text {i} Beam 0]: "{body}"')
    stats = summarize_stats(results)
    modes = []
    if draft is not None:
        modes.append(f"prompt lookup {args.prompt_lookup_config}"
                     + (f" x{draft.max_candidates} candidates" if draft.max_candidates > 1 else ""))
    if lookahead is not None:
        modes.append(f"lookahead {list(lookahead.triple)}")
    mode = " + ".join(modes) + f" ({args.workflow})" if modes else "plain decoding"
    print(
        f"[{mode}] {stats['generated_tokens']} tokens in {wall:.2f} s ({stats['generated_tokens'] / wall:.1f} tok/s); "
        f"{stats['steps']} steps, {stats['tokens_per_step']:.2f} tokens/step; "
        f"drafted {stats['drafted']}, accepted {stats['accepted']} ({100 * stats['acceptance_rate']:.1f}%); "
        f"{num_threads} CPU thread(s)"
    )
    if args.output_csv or args.output_npy:
        rows = output_id_rows([p.ids for p in prompts], [r.output_ids for r in results], args.max_output_len, end_id)
        for path, write in ((args.output_csv, write_csv), (args.output_npy, write_npy)):
            if path:
                write(path, rows)
                print(f"wrote {path}")
    if args.output_json:
        atomic_write_json(
            args.output_json,
            {
                "config": {
                    "engine_dir": args.engine_dir,
                    "workflow": args.workflow,
                    "prompt_lookup_config": args.prompt_lookup_config,
                    "draft": asdict(draft) if draft else None,
                    "sampling": asdict(sampling),
                    "max_output_len": args.max_output_len,
                    "max_input_length": args.max_input_length,
                    "backend": args.backend,
                    "end_id": end_id,
                    # what ran: an engine built with --use_paged_context_fmha disable runs without reuse
                    "kv_cache_enable_block_reuse": (runner.blocks.enable_reuse if hasattr(runner, "blocks")
                                                    else args.kv_cache_enable_block_reuse),
                    "kv_cache_free_gpu_memory_fraction": args.kv_cache_free_gpu_memory_fraction,
                    "kv_cache_tokens": pool.tokens if pool is not None else None,
                    "draft_length_policy": args.draft_length_policy,
                    "lookahead_config": list(lookahead.triple) if lookahead else None,
                    "step_cost_table": runner.step_cost_table,
                    "batch_size": len(prompts),
                    "num_threads": num_threads,
                    "device": where["device"],
                    "cuda_graphs": where["cuda_graphs"],
                    "cpu_weight_copies": args.cpu_weight_copies,
                    "torch_compile": args.torch_compile,
                    "kv_cache_dtype": str(pool.dtype).removeprefix("torch.") if pool is not None else None,
                    **weights_of(engine_cfg.pretrained),
                    "drafter_implementation": drafter.classes.implementation if drafter else None,
                },
                "wall_time_s": wall,
                "setup_time_s": start - begun,
                "compile": runner.describe()["compile"],  # counted through generation
                "tokens_per_s": stats["generated_tokens"] / wall if wall > 0 else 0.0,
                "stats": stats,
                "sequences": [
                    {
                        "text": text,
                        "output_ids": r.output_ids,
                        "generated_tokens": r.generated_tokens,
                        "steps": r.steps,
                        "drafted": r.drafted,
                        "accepted": r.accepted,
                        "tree_tokens": r.tree_tokens,
                        "accepted_by_source": r.accepted_by_source,
                    }
                    for r, text in zip(results, texts)
                ],
            },
        )
        print(f"wrote {args.output_json}")
    if printer is not None and printer.pipe_closed:  # after every file asked for is written: exit 141
        raise BrokenPipeError("stdout's reader has gone")
    return 0
