"""``serve.py``: an OpenAI-compatible server with continuous batching (like ``trtllm-serve``).

    python serve.py --engine_dir engine --prompt_lookup_config "[10,2,[0]]" --port 8000

``--engine_dir`` also takes a Hugging Face Llama directory or a GGUF file (built once into
the cache); without it, the bundled SmolLM2. See :mod:`promptlookup.serving.openai_server`
for the endpoints and :mod:`promptlookup.decoding.draft_budget` for ``--draft_token_budget``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Collection

from ..defaults import (DEFAULT_DRAFT_LENGTH_POLICY, DEFAULT_DRAFTER_MODE, DEFAULT_MIN_MATCHING_NGRAM_SIZE,
                        DRAFT_LENGTH_POLICIES)
from ..drafting.base import DRAFT_MODES
from ..errors import UserError
from .args import (ArgumentParser, add_block_reuse_argument, add_kv_dtype_argument, add_kv_fraction_argument,
                   add_num_threads_argument, add_pool_limit_options, add_pool_options, check_ngram_cache_paths,
                   finite_float, kv_cache_from_args,
                   parse_prompt_lookup_config, require_lookup_config)

API_KEY_ENV = "PROMPTLOOKUP_API_KEY"  # --api_key's default (as vLLM's VLLM_API_KEY)
DEFAULT_SHUTDOWN_TIMEOUT = 5.0  # seconds in-flight requests may still run after SIGTERM / the first SIGINT


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="serve.py", description="OpenAI-compatible server with prompt lookup.")
    p.add_argument("--engine_dir", default=None,
                   help="engine directory, Hugging Face Llama directory or GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--tokenizer_dir", default=None, help="default: the engine directory")
    p.add_argument("--cache_dir", default=None, help="where converted models are built (default: ~/.cache/promptlookup)")
    p.add_argument("--served_model_name", nargs="+", default=None,
                   help="the model id clients send, then any aliases (also accepted; the first is reported); "
                        "a request without 'model' gets the served one (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    p.add_argument("--prompt_lookup_config", default=None, help='"[k, n, [devices]]"; default: plain decoding')
    p.add_argument("--lookahead_config", default=None,
                   help='Lookahead decoding "[W,N,G]" for every request (instead of --prompt_lookup_config)')
    p.add_argument("--prompt_lookup_min_ngram", type=int, default=DEFAULT_MIN_MATCHING_NGRAM_SIZE,
                   help="shortest match that may draft")
    p.add_argument("--drafter_mode", choices=list(DRAFT_MODES), default=DEFAULT_DRAFTER_MODE,
                   help="see run.py --drafter_mode")
    add_pool_options(p)
    add_pool_limit_options(p)
    p.add_argument("--ngram_static_cache", "--lookup-cache-static", dest="ngram_static_cache", default=None,
                   help="persisted n-gram cache built offline (read only); this project's or llama.cpp's format")
    p.add_argument("--ngram_dynamic_cache", "--lookup-cache-dynamic", dest="ngram_dynamic_cache", default=None,
                   help="persisted n-gram cache that learns from outputs; saved when the server stops")
    p.add_argument("--draft_token_budget", type=int, default=None,
                   help="tokens one step may feed; drafts shrink as the batch grows (default: k + 1)")
    p.add_argument("--draft_length_policy", choices=list(DRAFT_LENGTH_POLICIES), default=DEFAULT_DRAFT_LENGTH_POLICY,
                   help="cost (default): keep only the draft tokens expected to pay off for the live batch on this "
                        "device (the step-cost table stored in the engine); full: the whole budget, as TensorRT-LLM")
    add_block_reuse_argument(p, "requests")
    p.add_argument("--max_tokens_in_paged_kv_cache", type=int, default=None,
                   help="KV cache budget in tokens (default: 2 x max_batch_size x max_seq_len)")
    add_kv_fraction_argument(p)
    add_kv_dtype_argument(p)
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    add_num_threads_argument(p)
    p.add_argument("--api_key", default=None,
                   help=f"clients must send 'Authorization: Bearer KEY' to /v1 routes (401 otherwise); default: "
                        f"${API_KEY_ENV} if set, else no key")
    p.add_argument("--shutdown_timeout", type=finite_float, default=DEFAULT_SHUTDOWN_TIMEOUT,
                   help="on SIGTERM or Ctrl-C, seconds in-flight requests may still run before they are ended "
                        "with an error (a second signal ends them at once)")
    p.add_argument("--max_waiting_requests", type=int, default=None,
                   help="requests that may wait to join a full batch; beyond it 429 with Retry-After (default: "
                        "8 x the engine's max_batch_size)")
    p.add_argument("--max_request_bytes", type=int, default=None,
                   help="largest request body; a larger one gets 413 before it is parsed (default: 64 bytes per "
                        "token of max_seq_len, at least 1 MiB)")
    p.add_argument("--ignore_unknown_fields", action="store_true",
                   help="accept requests with fields this server does not know, ignoring them (vLLM's behaviour; "
                        "each name is logged once); by default they get 400 unknown_field, as with trtllm-serve")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_llm(args: argparse.Namespace):
    from ..api import LLM, LookaheadDecodingConfig, NGramDecodingConfig

    spec = None
    if args.lookahead_config is not None:
        if args.prompt_lookup_config is not None:
            raise UserError("give --lookahead_config or --prompt_lookup_config, not both (the LLM API takes one "
                            "speculative config)")
        from ..decoding.lookahead import parse_lookahead_config

        spec = LookaheadDecodingConfig(*parse_lookahead_config(args.lookahead_config).triple)
    if args.prompt_lookup_config is not None:
        k, n, _ = parse_prompt_lookup_config(args.prompt_lookup_config)
        spec = NGramDecodingConfig(max_draft_len=k, max_matching_ngram_size=n,
                                   min_matching_ngram_size=args.prompt_lookup_min_ngram, mode=args.drafter_mode,
                                   is_keep_all=args.is_keep_all, is_use_oldest=args.is_use_oldest,
                                   is_public_pool=args.is_public_pool, static_cache=args.ngram_static_cache,
                                   dynamic_cache=args.ngram_dynamic_cache,
                                   ngram_pool_max_patterns=args.ngram_pool_max_patterns,
                                   public_text_max_tokens=args.public_text_max_tokens)
    model = args.engine_dir
    if model is None:
        from ..checkpoint.bundled import smollm2_gguf_path

        model = str(smollm2_gguf_path())
    return LLM(model, args.tokenizer_dir, speculative_config=spec, cache_dir=args.cache_dir,
               runtime_config=runtime_config(args), kv_cache_config=kv_cache_from_args(args),
               draft_length_policy=None if spec is None else args.draft_length_policy,
               draft_token_budget=args.draft_token_budget)


def runtime_config(args: argparse.Namespace):
    """``--device`` and ``--num_threads`` (its default resolved now) as the
    :class:`~promptlookup.runtime.options.RuntimeConfig` the LLM loads with."""
    from ..runtime.options import RuntimeConfig
    from ..threads import resolve_num_threads

    return RuntimeConfig(device=args.device, num_threads=resolve_num_threads(args.num_threads))


def check_args(args: argparse.Namespace, given: Collection[str] = frozenset()) -> None:
    """Refuse bad values of the server's own flags (one line each), and drafting flags that
    ``given`` (the dests the command line named) holds where no speculation would read them."""
    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be in [0, 65535], got {args.port}")
    if args.shutdown_timeout < 0:
        raise UserError(f"--shutdown_timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    if args.max_waiting_requests is not None and args.max_waiting_requests < 0:
        raise UserError(f"--max_waiting_requests must be >= 0, got {args.max_waiting_requests}")
    if args.max_request_bytes is not None and args.max_request_bytes < 1:
        raise UserError(f"--max_request_bytes must be >= 1, got {args.max_request_bytes}")
    require_lookup_config(args, given)
    if "draft_token_budget" in given and args.prompt_lookup_config is None:
        raise UserError("--draft_token_budget sizes prompt lookup's chain drafts, which are off (Lookahead's steps "
                        'are sized by each request alone); add --prompt_lookup_config "[k, n]" or drop it')
    if args.served_model_name is not None and not all(n.strip() for n in args.served_model_name):
        raise UserError("--served_model_name: names must not be empty")
    if args.api_key is not None and not args.api_key.strip():
        raise UserError(f"--api_key is empty, which would serve without a key; give a key, or leave the flag out "
                        f"(with ${API_KEY_ENV} unset) to serve without one")
    check_ngram_cache_paths(args)  # the dynamic cache is saved at shutdown: refuse an unwritable one now
    if args.draft_token_budget is not None and args.draft_token_budget < 1:
        raise UserError(f"--draft_token_budget must be at least 1, got {args.draft_token_budget}")
    from ..api.model_cache import is_engine_dir

    if args.prompt_lookup_config is not None and args.engine_dir is not None and is_engine_dir(Path(args.engine_dir)):
        from ..engine.config import read_engine_config

        k = parse_prompt_lookup_config(args.prompt_lookup_config)[0]
        limit = read_engine_config(args.engine_dir).limits.max_draft_len  # its config.json; no weights read
        if k > limit:
            raise UserError(f"--prompt_lookup_config k={k} exceeds the engine's max_draft_len {limit}; lower k or "
                            f"rebuild the engine with build.sh --max_draft_len {k}")


def api_key(args: argparse.Namespace) -> str | None:
    """``--api_key``, else ``$PROMPTLOOKUP_API_KEY``, else None (no key)."""
    import os

    return args.api_key or os.environ.get(API_KEY_ENV) or None


def main(argv: list[str] | None = None) -> int:
    """Bind the port (a busy one: exit 2 before anything loads), load the model, commit its
    KV pool, serve until SIGTERM/SIGINT (:mod:`promptlookup.serving.lifecycle`), then save
    the dynamic n-gram cache and return 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args, parser.given)
    runtime_config(args)  # a bad --num_threads or --device is refused before the port is bound
    from ..serving.lifecycle import bind, serve
    from ..serving.openai_server import OpenAIServer

    sock = bind(args.host, args.port)
    try:
        llm = build_llm(args)
        try:
            llm.runner.pool.commit()  # resident now: start-up memory is what the server holds
            names = args.served_model_name or [(args.engine_dir or "smollm2").rstrip("/").split("/")[-1]]
            server = OpenAIServer(llm, names, api_key=api_key(args),
                                  max_request_bytes=args.max_request_bytes,
                                  max_waiting_requests=args.max_waiting_requests,
                                  ignore_unknown_fields=args.ignore_unknown_fields)
            host, port = sock.getsockname()[:2]
            print(f"serving {names[0]} on http://{args.host}:{port}/v1", flush=True)
            serve(server, sock, args.shutdown_timeout)
        finally:
            llm.shutdown()  # cancels what is left and saves the dynamic n-gram cache
    finally:
        sock.close()
    print("stopped", flush=True)
    return 0
