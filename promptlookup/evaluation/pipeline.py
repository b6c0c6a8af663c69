"""The whole evaluation, from settings to reports, independent of argument parsing.

Order of work (every check that can fail on bad input runs before any model does, so a
bad flag never costs a half-finished run):

1. validate settings and output paths; load the tokenizer and the articles; build the
   prompts; check them against the engine's build limits;
2. run the contenders: our engine plain, then speculative; then Hugging Face plain, then
   prompt lookup (each family's plain run is the reference for its speculative run);
3. with ``sweep``, run every grid point on the same articles against our plain run.

Results come back as :class:`EvaluationResult`; writing files is the caller's job.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from ..defaults import (DEFAULT_COMPILE_MODE, DEFAULT_CPU_WEIGHT_COPIES, DEFAULT_DRAFT_LENGTH_POLICY,
                        DEFAULT_KV_CACHE_DTYPE, DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE, DEFAULT_WORKFLOW)
from ..drafting.base import DraftConfig
from ..engine.config import check_end_id
from ..errors import UserError
from ..fsutil import check_output_dir
from ..runtime.base import SamplingConfig
from . import sweep as sweep_mod
from .contenders import (
    ENGINE, HF, ContenderSpec, DecodeSettings, EngineBackend, HFBackend, draft_label, lookahead_label,
)
from ..decoding.lookahead import LookaheadConfig
from .dataset import HUB_CONFIG, HUB_DATASET, HUB_SPLIT, Article, load_articles
from .harness import RunRecord, batched, run_batches
from .hf_baseline import check_device, check_hf_model_dir
from .metrics import ContenderReport, summarize_record
from .prompts import build_prompt_ids, check_chat_template


@dataclass
class EvalSettings:
    """Everything one evaluation needs (the CLI fills it from flags)."""

    engine_dir: str | None = None
    tokenizer_dir: str | None = None
    hf_model_dir: str | None = None
    test_engine: bool = False
    test_hf: bool = False
    dataset_path: str | None = None
    batch_size: int = 1
    max_ite: int = 20
    max_input_length: int = 923
    output_len: int = 100
    draft: DraftConfig | None = None
    device_ids: list[int] | None = None
    kv_cache_enable_block_reuse: bool = DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE
    max_tokens_in_paged_kv_cache: int | None = None
    kv_cache_free_gpu_memory_fraction: float | None = None  # of the memory free after the weights load
    kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE  # our PyTorch engine's KV cache element type (see defaults)
    enable_chunked_context: bool = False  # TensorRT-LLM engines only
    workflow: str = DEFAULT_WORKFLOW
    draft_length_policy: str = DEFAULT_DRAFT_LENGTH_POLICY
    use_chat_template: bool = False
    truncation: str = "text"
    sampling: SamplingConfig = SamplingConfig()
    end_id: int | None = None
    data_type: str = "auto"
    hf_device: str | None = None  # None: cuda when available, else cpu
    device: str | None = None  # our PyTorch engine's device; None: cuda when available, else cpu
    cuda_graph_mode: bool | None = None  # None: on when our engine runs on a GPU
    cpu_weight_copies: int = DEFAULT_CPU_WEIGHT_COPIES  # our engine on a CPU: 1 or 2 (see defaults)
    compile_mode: str = DEFAULT_COMPILE_MODE  # our PyTorch engine: "off" or "inductor" (see defaults)
    random_seed: int = 0
    sweep: bool = False
    sweep_k: Sequence[int] = sweep_mod.DEFAULT_SWEEP_K
    sweep_n: Sequence[int] = sweep_mod.DEFAULT_SWEEP_N
    sweep_modes: Sequence[str] = sweep_mod.SWEEP_MODES
    progress: bool | None = None  # None: tqdm bars on terminals only
    keep_samples: bool = True
    backend: str = "auto"  # --backend: auto, torch or trtllm (see runtime.load_runner)
    lookahead: LookaheadConfig | None = None  # --lookahead_config: a Lookahead contender (with draft: combined)
    sweep_lookahead: Sequence[LookaheadConfig] = ()  # Lookahead points of the sweep (run with ``workflow``)
    # The drafter options every sweep point starts from (None: ``draft``'s, else the defaults);
    # a point sets its own k, n, mode and adaptive, and a dynamic cache is left out (see sweep_base).
    sweep_draft: DraftConfig | None = None

    def json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sampling"] = asdict(self.sampling)
        data["draft"] = None if self.draft is None else asdict(self.draft)
        data["sweep_k"], data["sweep_n"], data["sweep_modes"] = list(self.sweep_k), list(self.sweep_n), list(self.sweep_modes)
        data["lookahead"] = list(self.lookahead.triple) if self.lookahead else None
        data["sweep_lookahead"] = [list(c.triple) for c in self.sweep_lookahead]
        # What the sweep's points really share: the base without the fields each point sets or drops.
        data["sweep_draft"] = None if not self.sweep else {
            name: value for name, value in asdict(sweep_base(self)).items() if name not in SWEEP_POINT_FIELDS}
        return data


# DraftConfig fields a sweep point sets itself (SweepPoint.draft_config) or leaves out (a
# dynamic cache would make the points depend on their order): not shared by the points.
SWEEP_POINT_FIELDS = ("prompt_lookup_num_tokens", "max_matching_ngram_size", "mode", "adaptive", "dynamic_cache")


def sweep_base(settings: EvalSettings) -> DraftConfig:
    """The DraftConfig every sweep point starts from (:attr:`EvalSettings.sweep_draft`)."""
    s = settings
    return replace(s.sweep_draft or s.draft or DraftConfig(), dynamic_cache=None)


@dataclass
class EvaluationResult:
    settings: EvalSettings
    articles: list[Article]
    prompt_lengths: list[int]
    end_id: int
    reports: list[ContenderReport] = field(default_factory=list)
    sweep_rows: list[dict[str, Any]] = field(default_factory=list)
    sweep_best: dict[str, Any] | None = None
    sweep_baseline: dict[str, Any] | None = None  # our plain run, which every sweep row is compared with
    engine_limits: dict[str, Any] | None = None
    engine_vs_hf: dict[str, int] | None = None  # our plain vs HF plain: token-identical outputs

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "settings": s.json_dict(),
            "dataset": {"source": s.dataset_path or f"hub:{HUB_DATASET} {HUB_CONFIG} {HUB_SPLIT}",
                        "articles": len(self.articles), "ids": [a.id for a in self.articles],
                        "prompt_tokens": self.prompt_lengths},
            "end_id": self.end_id,
            "engine_limits": self.engine_limits,
            "timing": {"warmup": "the first batch of every contender is scored but not timed"},
            "contenders": [r.to_dict() for r in self.reports],
            "engine_vs_hf_plain": self.engine_vs_hf,
            "sweep": None if not s.sweep else {
                "baseline": self.sweep_baseline,
                "rows": self.sweep_rows,
                "best": self.sweep_best,
                "deploy": None if self.sweep_best is None else sweep_mod.deploy_hint(self.sweep_best, s.device_ids or [0],
                                                                                     s.workflow),
            },
        }


def validate(settings: EvalSettings) -> None:
    """Checks that need no model or data; raises :class:`UserError`."""
    s = settings
    if not (s.test_engine or s.test_hf or s.sweep):
        raise UserError("nothing to evaluate; pass --test_trt_llm (our engine), --test_hf, --sweep, or a combination")
    for flag, value in (("--batch_size", s.batch_size), ("--max_ite", s.max_ite),
                        ("--max_input_length", s.max_input_length), ("--output_len", s.output_len)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if s.sweep and s.max_ite < 2:
        raise UserError("--sweep compares speed, which needs timed batches: the first batch is a warm-up, so use --max_ite 2 or more")
    if (s.test_engine or s.sweep) and not s.engine_dir:
        raise UserError("--engine_dir is required to test our engine")


SWEEP_FILES = ("sweep.json", "sweep.csv", "sweep.png")
SWEEP_KIND = "summarize sweep"  # the kind in a sweep folder's output manifest (promptlookup.fsutil)


def ensure_sweep_dir(path: str) -> None:
    """The sweep directory is replaced as a whole: refuse one holding anything summarize.py did not write.

    A folder holding only the three sweep files (written before output manifests existed)
    still counts as a sweep folder.
    """
    check_output_dir(path, SWEEP_KIND, flag="--sweep_dir", legacy_names=SWEEP_FILES)


def _check_limits(limits: Any, settings: EvalSettings, prompt_lengths: Sequence[int]) -> None:
    s = settings
    if s.batch_size > limits.max_batch_size:
        raise UserError(f"--batch_size {s.batch_size} exceeds the engine's max_batch_size {limits.max_batch_size}; "
                        "lower it or rebuild the engine")
    longest = max(prompt_lengths)
    if longest > limits.max_input_len:
        raise UserError(f"a prompt has {longest} tokens but the engine's max_input_len is {limits.max_input_len}; "
                        f"pass --max_input_length {limits.max_input_len} or rebuild the engine")
    if longest + s.output_len > limits.max_seq_len:
        raise UserError(f"the longest prompt ({longest} tokens) plus --output_len {s.output_len} exceeds the engine's "
                        f"max_seq_len {limits.max_seq_len}; lower --max_input_length or --output_len, or rebuild")
    if s.end_id is not None:
        check_end_id(s.end_id, limits.vocab_size)
    ks = ([s.draft.prompt_lookup_num_tokens] if (s.draft and s.test_engine) else []) + (list(s.sweep_k) if s.sweep else [])
    if ks and max(ks) > limits.max_draft_len:
        raise UserError(f"prompt_lookup_num_tokens {max(ks)} exceeds the engine's max_draft_len {limits.max_draft_len}; "
                        f"lower it (or --sweep_k) or rebuild with --max_draft_len {max(ks)}")


def contender_specs(settings: EvalSettings) -> list[ContenderSpec]:
    """The contenders to run, each family's plain run before its speculative run."""
    s, specs = settings, []
    if s.test_engine or s.sweep:
        specs.append(ContenderSpec("ours plain", ENGINE))
    if s.test_engine and s.draft is not None:
        specs.append(ContenderSpec(f"ours lookup {s.workflow} {draft_label(s.draft)}", ENGINE, s.draft, s.workflow))
    if s.test_engine and s.lookahead is not None:  # --workflow honoured: both loops verify Lookahead's trees
        name = f"ours {lookahead_label(s.lookahead, s.workflow)}"
        specs.append(ContenderSpec(name, ENGINE, None, s.workflow, s.lookahead))
        if s.draft is not None:
            specs.append(ContenderSpec(f"{name} + lookup {draft_label(s.draft)}", ENGINE, s.draft, s.workflow,
                                       s.lookahead))
    if s.test_hf:
        specs.append(ContenderSpec("hf plain", HF))
        if s.draft is not None:
            hf_draft = DraftConfig(prompt_lookup_num_tokens=s.draft.prompt_lookup_num_tokens,
                                   max_matching_ngram_size=s.draft.max_matching_ngram_size)
            specs.append(ContenderSpec(f"hf lookup {draft_label(hf_draft)}", HF, hf_draft))
    return specs


def evaluate(
    settings: EvalSettings,
    *,
    clock: Callable[[], float] = time.perf_counter,
    log: Callable[[str], None] = lambda _msg: None,
) -> EvaluationResult:
    """Run the evaluation described by ``settings`` (see the module docstring for the order)."""
    from ..runtime import load_tokenizer

    s = settings
    validate(s)
    uses_engine = s.test_engine or s.sweep
    # Check the folders the user named before the tokenizer, so a wrong one is blamed by its own flag.
    if uses_engine:
        from ..engine.config import read_engine_config

        read_engine_config(s.engine_dir)
    if s.test_hf and s.hf_model_dir:
        check_hf_model_dir(s.hf_model_dir)
    tokenizer_dir = s.tokenizer_dir or (s.engine_dir if uses_engine else s.hf_model_dir or s.engine_dir)
    if not tokenizer_dir:
        raise UserError("no tokenizer: pass --tokenizer_dir (or --engine_dir / --hf_model_dir holding one)")
    tokenizer = load_tokenizer(tokenizer_dir)
    if s.use_chat_template:
        check_chat_template(tokenizer)
    end_id = s.end_id if s.end_id is not None else tokenizer.eos_token_id
    if end_id is None:
        raise UserError("the tokenizer has no end-of-sequence token; pass --end_id")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id

    articles = load_articles(s.dataset_path, limit=s.batch_size * s.max_ite, seed=s.random_seed)
    prompts = [build_prompt_ids(tokenizer, a.article, max_input_length=s.max_input_length,
                                use_chat_template=s.use_chat_template, truncation=s.truncation) for a in articles]
    lengths = [len(p) for p in prompts]
    batches = batched(prompts, s.batch_size)
    result = EvaluationResult(settings=s, articles=articles, prompt_lengths=lengths, end_id=end_id)

    decode_settings = DecodeSettings(max_new_tokens=s.output_len, end_id=end_id, pad_id=pad_id, sampling=s.sampling,
                                     draft_length_policy=s.draft_length_policy)
    engine = hf = None
    if s.test_engine or s.sweep:
        from ..engine.config import read_engine_config

        from ..engine.load import check_backend, check_trtllm_only_flags

        engine_cfg = read_engine_config(s.engine_dir)
        check_backend(s.backend, engine_cfg.backend, s.engine_dir)
        check_trtllm_only_flags(engine_cfg.backend, s.kv_cache_free_gpu_memory_fraction, s.enable_chunked_context)
        from ..drafting.concurrency import refuse_unrouted

        for config in (s.draft, sweep_base(s) if s.sweep else None):
            refuse_unrouted(config, inside_tensorrt_llm=engine_cfg.backend == "trtllm" and s.workflow == "v2")
        lookahead_flag = ("--lookahead_config" if s.test_engine and s.lookahead is not None else
                          "--sweep_lookahead" if s.sweep and s.sweep_lookahead else None)
        if lookahead_flag and engine_cfg.backend == "trtllm" and s.workflow != "v2":
            # generate would refuse it after the engine loads: TensorRT-LLM's runner verifies no token trees
            raise UserError(f"{lookahead_flag} on a TensorRT-LLM engine runs inside TensorRT-LLM, which needs "
                            f"--workflow v2, not {s.workflow}; pass --workflow v2, or use a PyTorch engine "
                            "(either workflow)")
        limits = engine_cfg.limits
        _check_limits(limits, s, lengths)
        result.engine_limits = asdict(limits)
        engine = EngineBackend(s.engine_dir, decode_settings, kv_cache_enable_block_reuse=s.kv_cache_enable_block_reuse,
                               device_ids=s.device_ids, max_tokens_in_paged_kv_cache=s.max_tokens_in_paged_kv_cache,
                               kv_cache_free_gpu_memory_fraction=s.kv_cache_free_gpu_memory_fraction,
                               kv_cache_dtype=s.kv_cache_dtype,
                               enable_chunked_context=s.enable_chunked_context,
                               tokenizer=tokenizer, device=s.device, cuda_graph_mode=s.cuda_graph_mode,
                               cpu_weight_copies=s.cpu_weight_copies, compile_mode=s.compile_mode,
                               backend=s.backend)
    if s.test_hf:
        check_hf_model_dir(s.hf_model_dir or tokenizer_dir)
        check_device(s.hf_device)
        hf = HFBackend(s.hf_model_dir or tokenizer_dir, decode_settings, data_type=s.data_type, device=s.hf_device)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def run(spec: ContenderSpec) -> RunRecord:
        backend = engine if spec.family == ENGINE else hf
        log(f"running {spec.name} on {len(articles)} articles in {len(batches)} batches")
        with backend.open(spec) as generate_batch:
            return run_batches(spec.name, generate_batch, batches, clock=clock, progress=s.progress)

    plain: dict[str, RunRecord] = {}
    for spec in contender_specs(s):
        record = run(spec)
        if not spec.speculative:
            plain[spec.family] = record
        result.reports.append(summarize_record(
            record, articles, decode, family=spec.family, workflow=spec.workflow,
            draft=None if spec.draft is None else asdict(spec.draft),
            lookahead=None if spec.lookahead is None else spec.lookahead.triple,
            plain=plain.get(spec.family), prompt_lengths=lengths, keep_samples=s.keep_samples))
    if hf is not None:
        hf.close()
    if ENGINE in plain and HF in plain:
        same = [a.output_ids == b.output_ids for a, b in zip(plain[ENGINE].outputs, plain[HF].outputs)]
        result.engine_vs_hf = {"identical": sum(same), "compared": len(same)}

    if s.sweep:
        base = sweep_base(s)
        for point in sweep_mod.sweep_grid(s.sweep_k, s.sweep_n, s.sweep_modes):
            spec = ContenderSpec(f"sweep {point.label}", ENGINE, point.draft_config(base), s.workflow)
            record = run(spec)
            report = summarize_record(record, articles, decode, family=ENGINE, workflow=s.workflow,
                                      draft=asdict(spec.draft), plain=plain[ENGINE], keep_samples=False)
            result.sweep_rows.append(sweep_mod.sweep_row(point, report))
        for la in s.sweep_lookahead:
            point = sweep_mod.SweepPoint("lookahead", False, 0, None, la.triple)
            spec = ContenderSpec(f"sweep {point.label}", ENGINE, None, s.workflow, la)
            report = summarize_record(run(spec), articles, decode, family=ENGINE, workflow=s.workflow, draft=None,
                                      lookahead=la.triple, plain=plain[ENGINE], keep_samples=False)
            result.sweep_rows.append(sweep_mod.sweep_row(point, report))
        result.sweep_best = sweep_mod.best_row(result.sweep_rows)
        baseline = summarize_record(plain[ENGINE], articles, decode, family=ENGINE, keep_samples=False)
        result.sweep_baseline = {"tokens_per_s": baseline.tokens_per_s, "tokens_per_step": baseline.tokens_per_step,
                                 "rouge1": baseline.rouge["rouge1"], "latency_s": baseline.latency_s}
    if engine is not None:
        engine.close()
    return result
