"""The TensorRT-LLM backend: a thin adapter over TensorRT-LLM's public Python API.

Targets **TensorRT-LLM 1.0** (the first release that has both paths below; in 0.1x
releases the V1 example was ``examples/prompt_lookup/run_dtm_pld.py`` with
``--prompt_lookup_config``, in 1.0 it is ``examples/ngram/run_dtm_ngram.py`` with
``--ngram_config``; the runtime calls used here are the same in both).

- **V1** (:class:`TrtllmRunner`): TensorRT's engine workflow in orchestrator mode, as in
  ``run_dtm_pld.py``. ``ModelRunnerCpp.from_dir(engine_dir, is_orchestrator_mode=True,
  device_ids=..., kv_cache_enable_block_reuse=True, ...)`` is created once; every step the
  decoding loop (:mod:`promptlookup.decoding.orchestrator`) calls ``generate`` with the whole
  sequences and one external draft each, and TensorRT-LLM verifies the drafts
  (``--speculative_decoding_mode draft_tokens_external``). KV block reuse turns the
  re-submitted prefix into cache hits. Implements :class:`promptlookup.runtime.base.Runner`.
- **V2** (:class:`TrtllmLookupGenerator`): the LLM API with
  ``speculative_config=NGramDecodingConfig(...)``. NGram drafting runs inside TensorRT-LLM's
  PyTorch backend, so ``model`` is a Hugging Face checkpoint directory, not an engine.

Nothing here imports ``tensorrt_llm`` at module import time; every entry point first checks
:func:`trtllm_unavailable_reason` and raises a one-line :class:`UserError` when TensorRT-LLM
or a suitable GPU is missing. All TensorRT-LLM classes are injectable, which is how the
tests exercise the argument and output mapping without a GPU. This module is **not run
against a real GPU in CI**.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..decoding.result import SequenceResult, StepCallback, StepEvent
from ..drafting.base import DraftConfig
from ..errors import UserError
from .base import EngineLimits, GenerationOutput, RunnerStats, SamplingConfig

TARGET_VERSION = "1.0"
MIN_COMPUTE_CAPABILITY = (8, 0)  # prompt lookup support matrix: Ampere or newer
_DRAFT_TOKENS_EXTERNAL = 2  # SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL (an IntFlag, 1 << 1)
_FIX = "use --backend torch, or run on a machine with TensorRT-LLM and an Ampere-or-newer GPU"


# --------------------------------------------------------------------------- environment


def _import_problem() -> str | None:
    """Why ``import tensorrt_llm`` does not work here, or None when it does."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "tensorrt_llm is not installed"
    try:
        importlib.import_module("tensorrt_llm")
    except Exception as exc:  # a broken install raises all sorts of errors
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"tensorrt_llm failed to import ({type(exc).__name__}: {first})"
    return None


def _gpu_problem() -> str | None:
    """Why no CUDA GPU of compute capability >= 8.0 is usable, or None when one is."""
    try:
        import torch
    except Exception:
        return "PyTorch is not importable, so no CUDA GPU can be found"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    best = max(
        (torch.cuda.get_device_capability(i), i) for i in range(torch.cuda.device_count())
    )
    if best[0] < MIN_COMPUTE_CAPABILITY:
        major, minor = best[0]
        return (
            f"the best visible GPU ({torch.cuda.get_device_name(best[1])}) has compute capability "
            f"{major}.{minor}; TensorRT-LLM prompt lookup needs 8.0 (Ampere) or newer"
        )
    return None


def trtllm_unavailable_reason() -> str | None:
    """One line saying why the TensorRT-LLM backend cannot run here, or None when it can.

    It can run when ``import tensorrt_llm`` succeeds and a CUDA GPU of compute capability
    8.0 or newer is visible. Importing TensorRT-LLM is slow (seconds), so callers should
    ask once per process.
    """
    problem = _import_problem() or _gpu_problem()
    return None if problem is None else f"{problem}; {_FIX}"


def _require_trtllm() -> None:
    reason = trtllm_unavailable_reason()
    if reason is not None:
        raise UserError(reason)


def _lazy(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


# --------------------------------------------------------------------------- engine config


@dataclass(frozen=True)
class TrtllmEngineConfig:
    """What the runner needs from a TensorRT-LLM engine's ``config.json``."""

    limits: EngineLimits
    tp_size: int
    pp_size: int
    speculative_decoding_mode: Any  # int (IntFlag value) or str, None when absent
    use_paged_context_fmha: bool | None  # None when the plugin config does not say

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


def read_engine_config(engine_dir: str | Path) -> TrtllmEngineConfig:
    """The runner's view of a TensorRT-LLM engine directory (the layout trtllm-build writes).

    Parsing and the completeness check (one ``rank{r}.engine`` per rank) are
    :func:`promptlookup.engine.config.read_engine_config`'s, shared with the PyTorch engine.
    """
    from ..engine.config import read_engine_config as read_any_engine

    config = read_any_engine(engine_dir)
    if config.backend != "trtllm":
        raise UserError(
            f"{engine_dir} is a {config.backend} engine, not a TensorRT-LLM engine; "
            "build one with trtllm-build (build.sh --backend trtllm) or run it with the PyTorch backend"
        )
    mapping = config.pretrained.get("mapping") or {}
    fmha = (config.build.get("plugin_config") or {}).get("use_paged_context_fmha")
    return TrtllmEngineConfig(
        limits=config.limits,
        tp_size=int(mapping.get("tp_size", 1)),
        pp_size=int(mapping.get("pp_size", 1)),
        speculative_decoding_mode=config.build.get("speculative_decoding_mode"),
        use_paged_context_fmha=None if fmha is None else bool(fmha),
    )


def _is_draft_tokens_external(mode: Any) -> bool:
    if isinstance(mode, bool):
        return False
    if isinstance(mode, int):
        return bool(mode & _DRAFT_TOKENS_EXTERNAL)
    return "draft_tokens_external" in str(mode).lower()


# --------------------------------------------------------------------------- V1 runner


def _sampling_kwargs(sampling: SamplingConfig) -> dict[str, Any]:
    """``ModelRunnerCpp.generate`` sampling kwargs (run.py's names and greedy defaults).

    Greedy is TensorRT-LLM's ``top_k=1`` (run.py's defaults: temperature 1.0, top_p 0.0,
    which the runner treats as "no nucleus filter").
    """
    if sampling.greedy:
        return dict(temperature=1.0, top_k=1, top_p=0.0, random_seed=sampling.random_seed)
    return dict(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        random_seed=sampling.random_seed,
    )


def _agreeing_prefix(draft: Sequence[int], new: Sequence[int]) -> int:
    n = 0
    for d, t in zip(draft, new):
        if d != t:
            break
        n += 1
    return n


class TrtllmRunner:
    """V1 runner: ``ModelRunnerCpp`` in orchestrator mode behind the :class:`Runner` protocol.

    Each :meth:`generate` call is one ``ModelRunnerCpp.generate`` call (one verification
    step per sequence when drafts are given). Output mapping, per sequence ``i`` with input
    length ``L_i`` and returned length ``S_i = sequence_lengths[i, 0]``:

    - ``output_ids`` = ``output_ids[i, 0, L_i:S_i]`` (TensorRT-LLM returns input + output),
      cut just after the first ``end_id``; ``finished`` says whether it was cut there.
    - ``num_accepted_draft_tokens`` = length of the longest common prefix of the draft and
      the new tokens (``run_dtm_pld``'s rule); ``num_draft_tokens`` = the draft's length.

    An empty draft is sent as ``[end_id]`` (as ``run_dtm_pld`` does, because an external
    draft must not be empty) and still counts as zero drafted tokens.

    Cost per call: O(sum of sequence lengths) to build the int32 input tensors; device work
    is TensorRT-LLM's. ``stats.forward_calls`` counts calls; ``forward_tokens`` and
    ``reused_tokens`` stay 0 because the executor does not report them per call.
    """

    def __init__(
        self,
        engine_dir: str | Path,
        *,
        device_ids: Sequence[int] | None = None,
        kv_cache_enable_block_reuse: bool = True,
        kv_cache_free_gpu_memory_fraction: float | None = None,
        max_batch_size: int | None = None,
        enable_chunked_context: bool = False,
        pad_id: int | None = None,
        hf_model_dir: str | Path | None = None,
        model_runner_cls: Any = None,
        lookup_generator_cls: Any = None,
    ) -> None:
        if model_runner_cls is None:
            _require_trtllm()
            model_runner_cls = _lazy("tensorrt_llm.runtime", "ModelRunnerCpp")
        self.engine_dir = Path(engine_dir)
        self.config = read_engine_config(self.engine_dir)
        self.limits: EngineLimits = self.config.limits
        self.device_ids = list(device_ids) if device_ids is not None else list(range(self.config.world_size))
        self.kv_cache_enable_block_reuse = kv_cache_enable_block_reuse
        self.pad_id = pad_id
        self.hf_model_dir = hf_model_dir
        self._lookup_generator_cls = lookup_generator_cls
        self._lookup: "TrtllmLookupGenerator | None" = None
        self.stats = RunnerStats()
        self._check_devices(self.device_ids)
        if max_batch_size is not None and not 1 <= max_batch_size <= self.limits.max_batch_size:
            raise UserError(
                f"max_batch_size {max_batch_size} is outside 1..{self.limits.max_batch_size} "
                f"(the engine's max_batch_size)"
            )
        kwargs: dict[str, Any] = dict(
            engine_dir=str(self.engine_dir),
            is_orchestrator_mode=True,
            device_ids=self.device_ids,
            kv_cache_enable_block_reuse=kv_cache_enable_block_reuse,
            max_batch_size=max_batch_size or self.limits.max_batch_size,
            # Whole sequences (prompt + output so far) are re-submitted every step, so the
            # runtime input limit is the sequence limit, as run_dtm_pld sets it.
            max_input_len=self.limits.max_seq_len - 1,
            max_beam_width=1,
            enable_chunked_context=enable_chunked_context,
        )
        if kv_cache_free_gpu_memory_fraction is not None:
            kwargs["kv_cache_free_gpu_memory_fraction"] = kv_cache_free_gpu_memory_fraction
        self._runner = model_runner_cls.from_dir(**kwargs)

    # -- validation ------------------------------------------------------------------

    def _check_devices(self, device_ids: Sequence[int]) -> None:
        world = self.config.world_size
        if len(device_ids) != world:
            raise UserError(
                f"device list {list(device_ids)} has {len(device_ids)} entries but the engine needs "
                f"tp_size*pp_size = {self.config.tp_size}*{self.config.pp_size} = {world} devices"
            )
        if len(set(device_ids)) != len(device_ids) or any(
            not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in device_ids
        ):
            raise UserError(f"device list {list(device_ids)} must hold distinct non-negative GPU indices")

    def validate_lookup(self, k: int, device_ids: Sequence[int] | None = None) -> None:
        """Check that this engine and setup can run prompt lookup with drafts of up to ``k``.

        Mirrors the prompt-lookup example's requirements: ``len(device_list) ==
        tp_size * pp_size``; the engine was built with ``--speculative_decoding_mode
        draft_tokens_external``, ``--max_draft_len >= k`` and paged context FMHA; KV block
        reuse is on.
        """
        self._check_devices(self.device_ids if device_ids is None else list(device_ids))
        if k < 1:
            raise UserError(f"prompt_lookup_num_tokens must be at least 1, got {k}")
        mode = self.config.speculative_decoding_mode
        if mode is not None and not _is_draft_tokens_external(mode):
            raise UserError(
                f"the engine in {self.engine_dir} was built with speculative_decoding_mode={mode!r}; "
                "rebuild it with --speculative_decoding_mode draft_tokens_external"
            )
        if self.limits.max_draft_len < k:
            raise UserError(
                f"prompt_lookup_num_tokens {k} exceeds the engine's max_draft_len "
                f"{self.limits.max_draft_len}; rebuild with --max_draft_len {k} or use a smaller k"
            )
        if self.config.use_paged_context_fmha is False:
            raise UserError(
                f"the engine in {self.engine_dir} was built without paged context FMHA, which KV "
                "reuse needs; rebuild it with --use_paged_context_fmha enable"
            )
        if not self.kv_cache_enable_block_reuse:
            raise UserError("prompt lookup on TensorRT-LLM needs --kv_cache_enable_block_reuse")

    # -- Runner protocol -------------------------------------------------------------

    def generate(
        self,
        batch_input_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        end_id: int,
        draft_tokens_list: Sequence[Sequence[int]] | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        request_ids: Sequence[int] | None = None,  # accepted for the loop; TRT-LLM keys noise by seed
    ) -> list[GenerationOutput]:
        """Continue each sequence; with drafts, verify them (see the class docstring)."""
        import torch

        batch = [list(map(int, ids)) for ids in batch_input_ids]
        if not batch:
            return []
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if len(batch) > self.limits.max_batch_size:
            raise UserError(
                f"batch of {len(batch)} exceeds the engine's max_batch_size {self.limits.max_batch_size}"
            )
        longest = max(len(ids) for ids in batch)
        if longest + max_new_tokens > self.limits.max_seq_len:
            raise UserError(
                f"sequence of {longest} tokens plus {max_new_tokens} new tokens exceeds the engine's "
                f"max_seq_len {self.limits.max_seq_len}"
            )
        drafts: list[list[int]] | None = None
        if draft_tokens_list is not None:
            drafts = [list(map(int, d)) for d in draft_tokens_list]
            if len(drafts) != len(batch):
                raise ValueError(f"{len(drafts)} drafts for a batch of {len(batch)} sequences")
            too_long = max(len(d) for d in drafts)
            if too_long > self.limits.max_draft_len:
                raise UserError(
                    f"a draft of {too_long} tokens exceeds the engine's max_draft_len "
                    f"{self.limits.max_draft_len}; rebuild with a larger --max_draft_len"
                )
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            end_id=end_id,
            pad_id=end_id if self.pad_id is None else self.pad_id,
            num_beams=1,
            streaming=False,  # streaming comes from the loop's per-step events instead
            return_dict=True,
            output_sequence_lengths=True,
            **_sampling_kwargs(sampling),
        )
        if drafts is not None:
            kwargs["draft_tokens_list"] = [d if d else [end_id] for d in drafts]
        inputs = [torch.tensor(ids, dtype=torch.int32) for ids in batch]
        out = self._runner.generate(inputs, **kwargs)
        self.stats.forward_calls += 1
        return self._map_outputs(out, batch, drafts, end_id, max_new_tokens)

    def generate_lookup(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        draft: DraftConfig,
        max_new_tokens: int,
        end_id: int,
        sampling: SamplingConfig = SamplingConfig(),
        on_step: StepCallback | None = None,
    ) -> list[SequenceResult]:
        """V2 (single call) for ``decoding.generate``: delegates to :class:`TrtllmLookupGenerator`.

        The LLM API's NGram path runs on TensorRT-LLM's PyTorch backend and loads the
        Hugging Face checkpoint (``hf_model_dir``), not this engine, with this engine's
        tensor/pipeline parallel sizes and limits. Note that the V1 executor stays loaded
        meanwhile, so both hold GPU memory.
        """
        if self.hf_model_dir is None:
            raise UserError(
                "V2 prompt lookup on TensorRT-LLM runs the LLM API's NGram decoding, which loads the "
                "Hugging Face checkpoint, not the engine; pass its directory (--hf_model_dir) or use --workflow v1"
            )
        if self._lookup is None:
            cls = self._lookup_generator_cls or TrtllmLookupGenerator
            self._lookup = cls(
                self.hf_model_dir,
                tensor_parallel_size=self.config.tp_size,
                pipeline_parallel_size=self.config.pp_size,
                max_batch_size=self.limits.max_batch_size,
                max_seq_len=self.limits.max_seq_len,
            )
        return self._lookup.generate(
            prompts, max_new_tokens=max_new_tokens, end_id=end_id, draft=draft, sampling=sampling, on_step=on_step
        )

    def close(self) -> None:
        """Shut down the V2 LLM if one was started (the V1 executor lives as long as this object)."""
        lookup, self._lookup = self._lookup, None
        if lookup is not None:
            lookup.close()

    @staticmethod
    def _map_outputs(
        out: dict,
        batch: list[list[int]],
        drafts: list[list[int]] | None,
        end_id: int,
        max_new_tokens: int,
    ) -> list[GenerationOutput]:
        output_ids = out["output_ids"]
        lengths = out["sequence_lengths"]
        results = []
        for i, ids in enumerate(batch):
            total = int(lengths[i][0])
            new = [int(t) for t in output_ids[i][0][len(ids) : total].tolist()][:max_new_tokens]
            if not new:
                raise RuntimeError(f"TensorRT-LLM returned no new tokens for sequence {i}")
            finished = end_id in new
            if finished:
                new = new[: new.index(end_id) + 1]
            draft = drafts[i] if drafts is not None else []
            results.append(
                GenerationOutput(
                    output_ids=new,
                    num_draft_tokens=len(draft),
                    num_accepted_draft_tokens=_agreeing_prefix(draft, new),
                    finished=finished,
                )
            )
        return results


# --------------------------------------------------------------------------- V2 generator


def check_llmapi_draft(draft: DraftConfig) -> None:
    """Raise :class:`UserError` unless ``draft`` maps onto ``NGramDecodingConfig``."""
    if draft.mode != "pool":
        raise UserError(
            f"draft mode {draft.mode!r} is implemented by the PyTorch backend only; TensorRT-LLM's "
            "NGramDecodingConfig supports the pool mode only (use --backend torch)"
        )
    extras = [
        name
        for name, on in (
            ("adaptive drafting", draft.adaptive),
            ("a static n-gram cache", draft.static_cache is not None),
            ("a dynamic n-gram cache", draft.dynamic_cache is not None),
        )
        if on
    ]
    if extras:
        raise UserError(
            f"{' and '.join(extras)} is implemented by the PyTorch backend only; "
            "TensorRT-LLM's NGramDecodingConfig has no such option (use --backend torch)"
        )
    if draft.prompt_lookup_num_tokens < 1 or draft.max_matching_ngram_size < 1:
        raise UserError(
            "NGramDecodingConfig needs prompt_lookup_num_tokens >= 1 and max_matching_ngram_size >= 1, "
            f"got {draft.prompt_lookup_num_tokens} and {draft.max_matching_ngram_size}"
        )


def _check_hf_model_dir(model: str) -> None:
    """The LLM API's PyTorch backend loads a Hugging Face checkpoint, not an engine."""
    path = Path(model)
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        return  # let TensorRT-LLM resolve it (it also accepts hub names it can reach)
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and ("build_config" in data or "pretrained_config" in data):
        raise UserError(
            f"{model} is a TensorRT-LLM engine or checkpoint; V2 on TensorRT-LLM runs NGram decoding "
            "on its PyTorch backend, which loads a Hugging Face checkpoint directory (use --workflow v1 "
            "for engines)"
        )


class TrtllmLookupGenerator:
    """V2: one ``LLM.generate_async`` per prompt with NGram speculative decoding.

    The ``LLM`` is built lazily from the first :class:`DraftConfig` seen
    (``NGramDecodingConfig(max_draft_len=k, max_matching_ngram_size=n, is_keep_all,
    is_use_oldest, is_public_pool)``, ``KvCacheConfig(enable_block_reuse=True)``,
    ``disable_overlap_scheduler=True`` which NGram requires) and rebuilt only when a
    different one arrives.

    What the LLM API reports, and so what :class:`SequenceResult` holds:

    - ``output_ids``: the generated ids. When TensorRT-LLM stops on ``end_id``
      (``finish_reason == "stop"``) but leaves it out of the ids, it is appended, so that
      ``output_ids`` ends with ``end_id`` exactly as on the PyTorch backend.
    - ``steps``, ``accepted``, ``draft_flags``: from the streamed chunks. Each streamed
      response is one iteration; its ``n`` new tokens are ``n - 1`` accepted draft tokens and
      one of the target's own. A chunk cut short by ``max_tokens`` is counted the same way.
    - ``drafted``: ``request_perf_metrics.speculative_decoding.total_draft_tokens``
      (requested with ``return_perf_metrics=True``). Draft counts are not in the token
      stream, so when the metric is missing or zero ``drafted`` falls back to ``accepted``
      (a lower bound; the acceptance rate then reads 1.0 and is not meaningful).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        kv_cache_free_gpu_memory_fraction: float | None = None,
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        llm_kwargs: dict[str, Any] | None = None,
        llm_cls: Any = None,
        ngram_config_cls: Any = None,
        kv_cache_config_cls: Any = None,
        sampling_params_cls: Any = None,
    ) -> None:
        if llm_cls is None:
            _require_trtllm()
            llm_cls = _lazy("tensorrt_llm", "LLM")
        self._llm_cls = llm_cls
        self._ngram_cls = ngram_config_cls or (lambda **kw: _lazy("tensorrt_llm.llmapi", "NGramDecodingConfig")(**kw))
        self._kv_cls = kv_cache_config_cls or (lambda **kw: _lazy("tensorrt_llm.llmapi", "KvCacheConfig")(**kw))
        self._sp_cls = sampling_params_cls or (lambda **kw: _lazy("tensorrt_llm", "SamplingParams")(**kw))
        self.model = str(model)
        _check_hf_model_dir(self.model)
        if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
            raise UserError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
        self.tensor_parallel_size = tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self.kv_cache_free_gpu_memory_fraction = kv_cache_free_gpu_memory_fraction
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.llm_kwargs = dict(llm_kwargs or {})
        self._llm: Any = None
        self._llm_draft: DraftConfig | None = None

    # -- LLM lifecycle ---------------------------------------------------------------

    def _llm_for(self, draft: DraftConfig) -> Any:
        check_llmapi_draft(draft)
        if self._llm is not None and self._llm_draft == draft:
            return self._llm
        self.close()
        spec = self._ngram_cls(
            max_draft_len=draft.prompt_lookup_num_tokens,
            max_matching_ngram_size=draft.max_matching_ngram_size,
            is_keep_all=draft.is_keep_all,
            is_use_oldest=draft.is_use_oldest,
            is_public_pool=draft.is_public_pool,
        )
        kv_kwargs: dict[str, Any] = dict(enable_block_reuse=True)
        if self.kv_cache_free_gpu_memory_fraction is not None:
            kv_kwargs["free_gpu_memory_fraction"] = self.kv_cache_free_gpu_memory_fraction
        kwargs: dict[str, Any] = dict(
            model=self.model,
            speculative_config=spec,
            kv_cache_config=self._kv_cls(**kv_kwargs),
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            disable_overlap_scheduler=True,
        )
        if self.max_batch_size is not None:
            kwargs["max_batch_size"] = self.max_batch_size
        if self.max_seq_len is not None:
            kwargs["max_seq_len"] = self.max_seq_len
        kwargs.update(self.llm_kwargs)
        self._llm = self._llm_cls(**kwargs)
        self._llm_draft = draft
        return self._llm

    def close(self) -> None:
        """Shut the current ``LLM`` down (its executor holds GPUs and worker processes)."""
        llm, self._llm, self._llm_draft = self._llm, None, None
        if llm is not None and hasattr(llm, "shutdown"):
            llm.shutdown()

    def __enter__(self) -> "TrtllmLookupGenerator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generation ------------------------------------------------------------------

    def _sampling_params(self, max_new_tokens: int, end_id: int, sampling: SamplingConfig) -> Any:
        kwargs: dict[str, Any] = dict(
            max_tokens=max_new_tokens,
            end_id=end_id,
            pad_id=end_id,
            detokenize=False,  # the CLI decodes; skip the LLM API's detokenizer
            return_perf_metrics=True,
        )
        if sampling.greedy:
            kwargs["top_k"] = 1
        else:
            kwargs["temperature"] = sampling.temperature
            kwargs["top_k"] = sampling.top_k or None
            kwargs["top_p"] = sampling.top_p if sampling.top_p < 1.0 else None
            kwargs["seed"] = sampling.random_seed
        return self._sp_cls(**kwargs)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        end_id: int,
        draft: DraftConfig,
        sampling: SamplingConfig = SamplingConfig(),
        on_step: StepCallback | None = None,
    ) -> list[SequenceResult]:
        """Generate for every prompt; all requests are in flight together.

        Results are read one request after another (the others keep running meanwhile), so
        ``on_step`` sees every event of sequence 0, then of sequence 1, and so on.
        """
        if max_new_tokens < 1:
            raise UserError(f"max_output_len must be at least 1, got {max_new_tokens}")
        llm = self._llm_for(draft)
        params = self._sampling_params(max_new_tokens, end_id, sampling)
        pending = [
            llm.generate_async([int(t) for t in p], sampling_params=params, streaming=True) for p in prompts
        ]
        return [self._collect(i, req, end_id, max_new_tokens, on_step) for i, req in enumerate(pending)]

    @staticmethod
    def _collect(
        index: int, request: Any, end_id: int, max_new_tokens: int, on_step: StepCallback | None
    ) -> SequenceResult:
        result = SequenceResult()
        seen = 0
        output = None
        for response in request:
            output = response.outputs[0]
            chunk = [int(t) for t in output.token_ids[seen:]]
            seen = len(output.token_ids)
            if not chunk:
                continue
            accepted = len(chunk) - 1
            result.steps += 1
            result.accepted += accepted
            result.output_ids.extend(chunk)
            result.draft_flags.extend([True] * accepted + [False])
            if on_step is not None:
                on_step(StepEvent(index, chunk, accepted))
        if output is None:
            raise RuntimeError(f"TensorRT-LLM returned no response for request {index}")
        stopped = getattr(output, "finish_reason", None) == "stop"
        if stopped and (not result.output_ids or result.output_ids[-1] != end_id):
            if len(result.output_ids) < max_new_tokens:
                result.output_ids.append(end_id)
                result.draft_flags.append(False)
        result.finished = bool(result.output_ids) and result.output_ids[-1] == end_id
        reported = _reported_drafted(output)
        result.drafted = max(reported, result.accepted)
        return result


def _reported_drafted(output: Any) -> int:
    metrics = getattr(output, "request_perf_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    value = getattr(spec, "total_draft_tokens", 0) if spec is not None else 0
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


__all__ = [
    "TARGET_VERSION",
    "TrtllmEngineConfig",
    "TrtllmLookupGenerator",
    "TrtllmRunner",
    "check_llmapi_draft",
    "read_engine_config",
    "trtllm_unavailable_reason",
]
