"""Build, merge and inspect persisted n-gram caches; simulate drafting without a model.

    python -m promptlookup.cli.ngram_cache create  --output corpus.ngc --tokenizer_dir TOK  a.txt b.jsonl
    python -m promptlookup.cli.ngram_cache merge   --output all.ngc  a.ngc b.ngc
    python -m promptlookup.cli.ngram_cache inspect all.ngc --top 5 [--decode --tokenizer_dir TOK]
    python -m promptlookup.cli.ngram_cache stats   --tokenizer_dir TOK outputs.jsonl --jsonl_field output

Inputs (``create`` and ``stats``), by file name:

- ``*.jsonl``: one JSON object per line; the text is the field ``--jsonl_field`` (default
  ``text``); ``stats`` also reads ``--prompt_field`` (if given) as the prompt;
- ``*.json``: already tokenized: ``{"tokenizer": {"name", "vocab_size", "vocab_sha256"},
  "sequences": [[ids...], ...], "prompt_lens": [int, ...]}`` (``prompt_lens`` optional);
- anything else: a UTF-8 text file, one sequence.

Text is tokenized with ``--tokenizer_dir`` (a Hugging Face tokenizer folder) or
``--gguf_file`` (the tokenizer inside a GGUF file), without special tokens. Errors are one
line on stderr and exit code 2.

Cache files may be in this project's versioned format or in llama.cpp's
(``llama-lookup-create``, ``llama-lookup``); every subcommand reads both, told apart by
content, and ``create``/``merge`` write either (``--format``). ``create`` counts n-grams of
``--ngram_min``..``--ngram_max`` tokens; the defaults follow the format: 1..4 for this
project's, and 2..2 for llama.cpp's, which is what ``llama-lookup-create`` writes for a static
cache (``LLAMA_NGRAM_STATIC``). ``inspect --decode`` shows each listed n-gram and its next
token as text (needs the tokenizer: ``--tokenizer_dir``, which may be an engine directory,
or ``--gguf_file``).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
from typing import Any

from ..drafting import DraftConfig, NgramCache, TokenizerIdentity, config_grid, simulate_corpus
from ..drafting.base import DRAFT_MODES
from ..drafting.drafter import validate_config
from ..drafting.cache_file import (
    DEFAULT_MAX_NGRAM,
    FORMATS,
    LLAMACPP_NGRAM_MAX,
    LLAMACPP_NGRAM_STATIC,
    MAX_NGRAM_LIMIT,
    file_format,
)
from ..errors import UserError, run_cli
from ..fsutil import atomic_write_json, ensure_writable
from .args import ArgumentParser


# -- tokenizer and inputs ------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def load_tokenizer(tokenizer_dir: str | None, gguf_file: str | None) -> tuple[Any, TokenizerIdentity] | None:
    """The tokenizer named by the flags, with its identity; None if neither flag is given."""
    if tokenizer_dir is None and gguf_file is None:
        return None
    if tokenizer_dir is not None and gguf_file is not None:
        raise UserError("pass either --tokenizer_dir or --gguf_file, not both")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if gguf_file is not None:
        path = Path(gguf_file)
        if not path.is_file():
            raise UserError(f"--gguf_file {path} does not exist")
        folder, kwargs, name = str(path.resolve().parent), {"gguf_file": path.name}, path.name
    else:
        path = Path(tokenizer_dir)  # type: ignore[arg-type]
        if not path.is_dir():
            raise UserError(f"--tokenizer_dir {path} is not a directory")
        folder, kwargs, name = str(path), {}, path.resolve().name
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
    except Exception as exc:  # transformers raises many types for unusable folders/files
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise UserError(f"cannot load a tokenizer from {path} ({first})") from None
    return tokenizer, TokenizerIdentity.from_tokenizer(tokenizer, name=name)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _token_list(value: Any, where: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in value):
        raise UserError(f"{where} must be a list of non-negative integer token ids")
    too_big = max(value, default=-1)
    if too_big >= vocab_size:  # a cache holding it would crash generation ("index out of range")
        raise UserError(f"{where} holds token id {too_big}, outside the tokenizer's vocabulary of {vocab_size} "
                        f"tokens (ids 0..{vocab_size - 1})")
    return value


def read_sequences(
    paths: list[str], tok: tuple[Any, TokenizerIdentity] | None, field: str, prompt_field: str | None
) -> tuple[list[tuple[list[int], int]], TokenizerIdentity]:
    """(token ids, prompt length) for every sequence in ``paths``, and the tokenizer identity."""
    identity = tok[1] if tok else None
    out: list[tuple[list[int], int]] = []
    for name in paths:
        path = Path(name)
        if not path.is_file():
            raise UserError(f"input {path} does not exist")
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UserError(f"input {path} is not UTF-8 text") from None
        suffix = path.suffix.lower()
        if suffix == ".json":
            try:
                data = json.loads(raw)
            except ValueError as exc:
                raise UserError(f"input {path} is not valid JSON ({exc})") from None
            if not isinstance(data, dict) or "sequences" not in data or "tokenizer" not in data:
                raise UserError(f"input {path}: a .json input must be an object with 'tokenizer' and 'sequences'")
            file_id = TokenizerIdentity.from_json(data["tokenizer"], f"input {path}")
            if identity is None:
                identity = file_id
            elif not identity.compatible(file_id):
                raise UserError(
                    f"input {path} was tokenized with {file_id.describe()}, not with {identity.describe()}"
                )
            seqs = data["sequences"]
            if not isinstance(seqs, list):
                raise UserError(f"input {path}: 'sequences' must be a list of token-id lists")
            lens = data.get("prompt_lens", [0] * len(seqs))
            if not isinstance(lens, list) or len(lens) != len(seqs):
                raise UserError(f"input {path}: 'prompt_lens' must be a list with one length per sequence")
            for i, (ids, plen) in enumerate(zip(seqs, lens)):
                ids = _token_list(ids, f"input {path} sequence {i}", file_id.vocab_size)
                if isinstance(plen, bool) or not isinstance(plen, int) or not 0 <= plen <= len(ids):
                    raise UserError(f"input {path}: prompt_lens[{i}] must be an integer in 0..{len(ids)}")
                out.append((ids, plen))
            continue
        if tok is None:
            raise UserError(f"input {path} is text; pass --tokenizer_dir or --gguf_file to tokenize it")
        tokenizer = tok[0]
        if suffix == ".jsonl":
            for lineno, line in enumerate(raw.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise UserError(f"input {path} line {lineno} is not valid JSON") from None
                if not isinstance(record, dict) or not isinstance(record.get(field), str):
                    raise UserError(f"input {path} line {lineno} has no string field '{field}'; choose it with --jsonl_field")
                prompt: list[int] = []
                if prompt_field is not None:
                    if not isinstance(record.get(prompt_field), str):
                        raise UserError(f"input {path} line {lineno} has no string field '{prompt_field}' (--prompt_field)")
                    prompt = _encode(tokenizer, record[prompt_field])
                out.append((prompt + _encode(tokenizer, record[field]), len(prompt)))
        else:
            out.append((_encode(tokenizer, raw), 0))
    if identity is None:
        raise UserError("no tokenizer: pass --tokenizer_dir or --gguf_file, or tokenized .json inputs")
    if not out:
        raise UserError("the inputs hold no sequences")
    return out, identity


def _int_list(text: str, flag: str, low: int = 1) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < low for v in values):
        raise UserError(f"{flag} must list integers >= {low}, got {text!r}")
    return values


def _check_jsonl_flags(args) -> None:
    """Refuse ``--jsonl_field``/``--prompt_field`` when no input is a .jsonl file (nothing reads them)."""
    if any(Path(name).suffix.lower() == ".jsonl" for name in args.inputs):
        return
    for flag in ("jsonl_field", "prompt_field"):
        if getattr(args, flag, None) is not None:
            raise UserError(f"--{flag} is read from .jsonl inputs only, and no input is a .jsonl file; drop it")


# -- subcommands -----------------------------------------------------------------------------
def ngram_range(args) -> tuple[int, int]:
    """(``--ngram_min``, ``--ngram_max``) with the format's defaults: 1..4 for promptlookup,
    llama.cpp's static 2..2 for llama.cpp (there, ``--ngram_max 1`` alone means 1..1)."""
    static = args.format == "llama.cpp"
    high = args.max_ngram if args.max_ngram is not None else (LLAMACPP_NGRAM_STATIC if static else DEFAULT_MAX_NGRAM)
    if args.ngram_min is not None:
        low = args.ngram_min
    else:
        low = min(LLAMACPP_NGRAM_STATIC, high) if static else 1
    if not 1 <= high <= MAX_NGRAM_LIMIT:
        raise UserError(f"--ngram_max must be between 1 and {MAX_NGRAM_LIMIT}, got {high}")
    if static and high > LLAMACPP_NGRAM_MAX:
        raise UserError(f"--format llama.cpp holds n-grams of at most {LLAMACPP_NGRAM_MAX} tokens; "
                        f"pass --ngram_max {LLAMACPP_NGRAM_MAX} or less, got {high}")
    if not 1 <= low <= high:
        raise UserError(f"--ngram_min must be between 1 and --ngram_max {high}, got {low}")
    return low, high


def cmd_create(args) -> int:
    low, high = ngram_range(args)
    tok = load_tokenizer(args.tokenizer_dir, args.gguf_file)
    _check_jsonl_flags(args)
    sequences, identity = read_sequences(args.inputs, tok, args.jsonl_field or "text", None)
    cache = NgramCache(high)
    for ids, _ in sequences:
        cache.update(ids, min_ngram=low)
    cache.save(args.output, identity, args.format)
    tokens = sum(len(ids) for ids, _ in sequences)
    print(
        f"wrote {args.output} ({args.format} format): {cache.num_ngrams()} n-grams (sizes {low}..{high}) from "
        f"{len(sequences)} sequence(s), {tokens} tokens, tokenizer {identity.describe()}"
    )
    return 0


def cmd_merge(args) -> int:
    merged: NgramCache | None = None
    identity: TokenizerIdentity | None = None
    for name in args.inputs:
        cache, ident = NgramCache.load(name, expect=identity)
        if identity is None and ident is not None:
            identity = ident
        if merged is None:
            merged = NgramCache(cache.max_ngram)
        elif cache.max_ngram > merged.max_ngram:
            grown = NgramCache(cache.max_ngram)
            grown.merge(merged)
            merged = grown
        merged.merge(cache)
    assert merged is not None
    out_format = file_format(args.inputs[0]) if args.format == "auto" else args.format
    if out_format == "promptlookup" and identity is None:
        raise UserError("the inputs are all in llama.cpp's format, which records no tokenizer; "
                        "write the result with --format llama.cpp")
    # a llama.cpp input read before a promptlookup one was checked only against the vocabulary size
    if identity is not None and merged.max_token() >= identity.vocab_size:
        raise UserError(f"an input holds token id {merged.max_token()}, outside the tokenizer's {identity.vocab_size} "
                        f"tokens ({identity.describe()}); the caches come from different tokenizers")
    merged.save(args.output, identity, out_format)
    print(f"wrote {args.output} ({out_format} format): {merged.num_ngrams()} n-grams merged from "
          f"{len(args.inputs)} cache(s)")
    return 0


def _decoder(args, identity: TokenizerIdentity | None, cache: NgramCache):
    """A token-ids -> text function for ``inspect --decode`` (None without --decode), after
    checking that the tokenizer is the cache's."""
    if not args.decode:
        if args.tokenizer_dir or args.gguf_file:
            raise UserError("--tokenizer_dir/--gguf_file are read by inspect only with --decode; add --decode")
        return None
    tok = load_tokenizer(args.tokenizer_dir, args.gguf_file)
    if tok is None:
        raise UserError("--decode needs the tokenizer: pass --tokenizer_dir (a tokenizer or engine directory) "
                        "or --gguf_file")
    tokenizer, mine = tok
    if identity is not None and not identity.compatible(mine):
        raise UserError(f"{args.cache} was built with {identity.describe()}, not with {mine.describe()}; "
                        "pass the tokenizer it was built with")
    if cache.max_token() >= mine.vocab_size:  # llama.cpp's files record no tokenizer: the one check possible
        raise UserError(f"{args.cache} holds token id {cache.max_token()}, outside {mine.describe()}'s "
                        f"{mine.vocab_size} tokens; pass the tokenizer it was built with")
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def cmd_inspect(args) -> int:
    if args.top < 0:
        raise UserError(f"--top must be >= 0, got {args.top}")
    cache, identity = NgramCache.load(args.cache)
    decode = _decoder(args, identity, cache)
    size = Path(args.cache).stat().st_size
    fmt = file_format(args.cache)
    report: dict[str, Any] = {
        "path": str(args.cache),
        "file_bytes": size,
        "format": fmt,
        "tokenizer": identity.to_json() if identity else None,
        "max_ngram": cache.max_ngram,
        "sizes": [],
    }
    who = f"tokenizer {identity.describe()}" if identity else "no tokenizer recorded"
    print(f"{args.cache}: {size} bytes, {fmt} format, {who}, n-gram sizes 1..{cache.max_ngram}")
    print(f"{'size':>4} {'n-grams':>10} {'pairs':>10} {'observations':>13}")
    for s in range(1, cache.max_ngram + 1):
        row = {
            "size": s,
            "ngrams": cache.num_ngrams(s),
            "pairs": cache.num_pairs(s),
            "observations": cache.total_count(s),
            "top": [
                {"ngram": list(g), "observations": total, "top_token": t, "top_count": c,
                 **({"text": decode(g), "top_text": decode([t])} if decode else {})}
                for g, total, t, c in cache.top(s, args.top)
            ],
        }
        report["sizes"].append(row)
        print(f"{s:>4} {row['ngrams']:>10} {row['pairs']:>10} {row['observations']:>13}")
    if args.top:
        for row in report["sizes"]:
            for item in row["top"]:
                gram, nxt = item["ngram"], item["top_token"]
                if decode:
                    gram, nxt = f"{gram} {item['text']!r}", f"{nxt} {item['top_text']!r}"
                print(
                    f"  {row['size']}-gram {gram}: seen {item['observations']}x, "
                    f"most often followed by {nxt} ({item['top_count']}x)"
                )
    if args.output_json:
        atomic_write_json(args.output_json, report)
    return 0


# stats flags read by some drafter modes only: (flag, attribute, the modes that read it)
_MODE_FLAGS = (
    ("--n", "n", ("pool",)),
    ("--max_match_len", "max_match_len", ("longest",)),
    ("--is_keep_all", "is_keep_all", ("pool",)),
    ("--is_use_oldest", "is_use_oldest", ("pool",)),
    ("--is_public_pool", "is_public_pool", ("pool", "longest")),
)


def stats_configs(args) -> list[DraftConfig]:
    """Every configuration ``stats`` simulates, validated (before any output); a flag that no
    selected mode reads is refused, and each mode gets only the flags it reads."""
    ks = _int_list(args.k, "--k")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        raise UserError(f"--modes must name at least one mode of {', '.join(DRAFT_MODES)}")
    for m in modes:
        if m not in DRAFT_MODES:
            raise UserError(f"--modes: unknown mode {m!r}; use {', '.join(DRAFT_MODES)}")
    for flag, attr, readers in _MODE_FLAGS:
        if getattr(args, attr) is not None and not any(m in readers for m in modes):
            raise UserError(f"{flag} is read by the {' and '.join(readers)} mode{'s' if len(readers) > 1 else ''} only, "
                            f"and --modes {','.join(modes)} selects none; drop {flag} or add the mode")
    ns = _int_list(args.n, "--n") if args.n is not None else [1, 2, 3]
    adaptive = {"off": [False], "on": [True], "both": [False, True]}[args.adaptive]
    if args.max_match_len is not None and args.max_match_len < 1:
        raise UserError(f"--max_match_len must be >= 1, got {args.max_match_len}")
    configs: list[DraftConfig] = []
    for mode in dict.fromkeys(modes):
        fields: dict[str, Any] = {"static_cache": args.static_cache}
        for _, attr, readers in _MODE_FLAGS:  # --n is the grid's (ns), the others the mode's own fields
            if attr != "n" and mode in readers and getattr(args, attr) is not None:
                fields[attr] = getattr(args, attr)
        configs += config_grid(DraftConfig(**fields), ks, ns, [mode], adaptive)  # the rest: DraftConfig's defaults
    for cfg in configs:
        validate_config(cfg)
    return configs


def cmd_stats(args) -> int:
    configs = stats_configs(args)
    _check_jsonl_flags(args)
    if args.prompt_len and args.prompt_field is not None:
        raise UserError("--prompt_len and --prompt_field are exclusive")
    tok = load_tokenizer(args.tokenizer_dir, args.gguf_file)
    sequences, identity = read_sequences(args.inputs, tok, args.jsonl_field or "text", args.prompt_field)
    if args.static_cache is not None:  # refuse an unusable cache before any output
        NgramCache.load(args.static_cache, expect=identity)
    if args.prompt_len:
        sequences = [(ids, min(args.prompt_len, len(ids))) for ids, plen in sequences]
    rows = []
    header = f"{'configuration':<34} {'steps':>7} {'drafted':>8} {'accepted':>8} {'accept%':>8} {'tok/step':>8} {'us/step':>8}"
    print(f"{len(sequences)} sequence(s), {sum(len(s) - p for s, p in sequences)} output tokens, tokenizer {identity.describe()}")
    print(header)
    print("-" * len(header))
    for cfg in configs:
        st = simulate_corpus(sequences, cfg, tokenizer=identity if cfg.static_cache else None)
        rows.append({"config": {"mode": cfg.mode, "k": cfg.prompt_lookup_num_tokens,
                                "n": cfg.max_matching_ngram_size, "adaptive": cfg.adaptive,
                                "max_match_len": cfg.max_match_len}, **st.to_dict()})
        print(
            f"{st.label:<34} {st.steps:>7} {st.drafted:>8} {st.accepted:>8} {100 * st.acceptance_rate:>7.1f}% "
            f"{st.tokens_per_step:>8.3f} {st.draft_us_per_step:>8.1f}"
        )
    if args.output_json:
        atomic_write_json(args.output_json, {"tokenizer": identity.to_json(), "inputs": list(args.inputs),
                                             "sequences": len(sequences), "results": rows})
    return 0


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m promptlookup.cli.ngram_cache", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    def tokenizer_flags(p):
        p.add_argument("--tokenizer_dir", default=None, help="Hugging Face tokenizer folder")
        p.add_argument("--gguf_file", default=None, help="read the tokenizer from this GGUF file")
        p.add_argument("--jsonl_field", default=None, help="field holding the text in .jsonl inputs (default: text)")

    p = sub.add_parser("create", help="build a static cache from text, JSONL or tokenized JSON")
    p.add_argument("inputs", nargs="+", help="text, .jsonl or tokenized .json files")
    p.add_argument("--output", required=True, help="cache file to write")
    p.add_argument("--ngram_max", "--max_ngram", dest="max_ngram", type=int, default=None,
                   help=f"largest n-gram size counted (default: {DEFAULT_MAX_NGRAM}; --format llama.cpp: "
                        f"{LLAMACPP_NGRAM_STATIC}, as llama-lookup-create's static cache)")
    p.add_argument("--ngram_min", type=int, default=None,
                   help=f"smallest n-gram size counted (default: 1; --format llama.cpp: {LLAMACPP_NGRAM_STATIC}, "
                        "as llama-lookup-create's static cache)")
    p.add_argument("--format", choices=list(FORMATS), default="promptlookup",
                   help="file format: this project's (records the tokenizer) or llama.cpp's (n-grams of at most 4 tokens)")
    tokenizer_flags(p)

    p = sub.add_parser("merge", help="add the counts of several caches (same tokenizer) into one")
    p.add_argument("inputs", nargs="+", help="cache files to merge")
    p.add_argument("--output", required=True, help="cache file to write")
    p.add_argument("--format", choices=["auto", *FORMATS], default="auto",
                   help="file format of the output (auto: the first input's)")

    p = sub.add_parser("inspect", help="print a cache's header, sizes and most frequent n-grams")
    p.add_argument("cache", help="cache file to inspect")
    p.add_argument("--top", type=int, default=5, help="n-grams to list per size")
    p.add_argument("--decode", action="store_true", help="show the listed n-grams and next tokens as text too")
    p.add_argument("--tokenizer_dir", default=None,
                   help="with --decode: Hugging Face tokenizer folder or engine directory")
    p.add_argument("--gguf_file", default=None, help="with --decode: read the tokenizer from this GGUF file")
    p.add_argument("--output_json", default=None, help="also write the report as JSON")

    p = sub.add_parser("stats", help="simulate drafting over texts without a model")
    p.add_argument("inputs", nargs="+", help="text, .jsonl or tokenized .json files")
    tokenizer_flags(p)
    p.add_argument("--prompt_field", default=None, help="JSONL field holding the prompt (prepended)")
    p.add_argument("--prompt_len", type=int, default=0, help="treat the first N tokens of each sequence as prompt")
    p.add_argument("--k", default="4,10", help="prompt_lookup_num_tokens values, comma separated")
    p.add_argument("--n", default=None, help="max_matching_ngram_size values (pool mode; default: 1,2,3)")
    p.add_argument("--modes", default="pool,longest", help="drafter modes to simulate, comma separated")
    p.add_argument("--adaptive", choices=["off", "on", "both"], default="off", help="simulate adaptive draft sizing")
    p.add_argument("--max_match_len", type=int, default=None, help="longest mode: longest match considered (default: 64)")
    for flag, text in (("--is_keep_all", "pool: keep every candidate continuation of a pattern"),
                       ("--is_use_oldest", "pool: draft the oldest candidate of a pattern"),
                       ("--is_public_pool", "pool: one pool shared by all sequences")):
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f"{text} (default: on)")
    p.add_argument("--static_cache", default=None, help="also draft from this cache when the context has nothing")
    p.add_argument("--output_json", default=None, help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "prompt_len", 0) < 0:
        raise UserError(f"--prompt_len must be >= 0, got {args.prompt_len}")
    # what the run reads: an output must replace none of it
    inputs = [("input", name) for name in getattr(args, "inputs", [])]
    if args.command == "inspect":
        inputs.append(("the inspected cache", args.cache))
    inputs += [(f"--{flag}", getattr(args, flag, None)) for flag in ("static_cache", "tokenizer_dir", "gguf_file")]
    for flag in ("output", "output_json"):  # fail before any work, not after it
        if getattr(args, flag, None):
            ensure_writable(getattr(args, flag), f"--{flag}", inputs=inputs)
    handler = {"create": cmd_create, "merge": cmd_merge, "inspect": cmd_inspect, "stats": cmd_stats}[args.command]
    return handler(args)


if __name__ == "__main__":
    run_cli(main)
