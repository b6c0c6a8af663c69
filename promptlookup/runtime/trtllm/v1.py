"""V1: TensorRT-LLM's ``ModelRunnerCpp`` in orchestrator mode behind the :class:`Runner` protocol.

As in TensorRT-LLM's ``run_dtm_pld.py``: ``ModelRunnerCpp.from_dir(engine_dir,
is_orchestrator_mode=True, device_ids=..., kv_cache_enable_block_reuse=True, ...)`` is
created once; every step the decoding loop (:mod:`promptlookup.decoding.orchestrator`)
calls ``generate`` with the whole sequences and one external draft each, and TensorRT-LLM
verifies the drafts (``--speculative_decoding_mode draft_tokens_external``). KV block reuse
turns the re-submitted prefix into cache hits.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..results import SequenceResult, StepCallback
from ...defaults import DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE
from ...drafting.base import DraftConfig
from ...errors import UserError
from ...drafting.tree import common_prefix_len
from ..base import EngineLimits, GenerationOutput, RunnerCapabilities, RunnerStats, SamplingConfig, validate_batch
from .config import TrtllmEngineConfig, is_draft_tokens_external
from .env import lazy, require_trtllm
from .releases import installed_release
from .v2 import TrtllmLookupGenerator


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




class TrtllmRunner:
    """V1 runner: ``ModelRunnerCpp`` in orchestrator mode behind the :class:`Runner` protocol.

    Each :meth:`generate` call is one ``ModelRunnerCpp.generate`` call (one verification
    step per sequence when drafts are given). Output mapping, per sequence ``i`` with input
    length ``L_i`` and returned length ``S_i = sequence_lengths[i, 0]``:

    - ``output_ids`` = ``output_ids[i, 0, L_i:S_i]`` (TensorRT-LLM returns input + output),
      cut just after the first ``end_id``; ``finished`` says whether it was cut there.
    - ``accepted`` = length of the longest common prefix of the draft and the new tokens
      (``run_dtm_pld``'s rule); ``drafted`` = the draft's length.

    An empty draft is sent as ``[end_id]`` (as ``run_dtm_pld`` does, because an external
    draft must not be empty) and still counts as zero drafted tokens.

    Cost per call: O(sum of sequence lengths) to build the int32 input tensors; device work
    is TensorRT-LLM's. ``stats.forward_calls`` counts calls; ``forward_tokens`` and
    ``reused_tokens`` stay 0 because the executor does not report them per call.
    """

    capabilities = RunnerCapabilities(own_speculation=True)
    step_cost_table = None  # TensorRT-LLM sizes its own steps

    def __init__(
        self,
        config: TrtllmEngineConfig,
        *,
        device_ids: Sequence[int] | None = None,
        kv_cache_enable_block_reuse: bool = DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE,
        kv_cache_free_gpu_memory_fraction: float | None = None,
        max_tokens_in_paged_kv_cache: int | None = None,
        max_batch_size: int | None = None,
        enable_chunked_context: bool = False,
        pad_id: int | None = None,
        hf_model_dir: str | Path | None = None,
        model_runner_cls: Any = None,
        lookup_generator_cls: Any = None,
    ) -> None:
        if model_runner_cls is None:
            require_trtllm()
            installed_release().require("engine_workflow", f"the TensorRT-LLM engine {config.directory}")
            model_runner_cls = lazy("tensorrt_llm.runtime", "ModelRunnerCpp")
        self.engine_dir = config.directory
        self.config = config
        self.limits: EngineLimits = self.config.limits
        self.device_ids = list(device_ids) if device_ids is not None else list(range(self.config.world_size))
        self.kv_cache_enable_block_reuse = kv_cache_enable_block_reuse
        self.kv_cache_free_gpu_memory_fraction = kv_cache_free_gpu_memory_fraction
        self.max_tokens_in_paged_kv_cache = max_tokens_in_paged_kv_cache
        self.enable_chunked_context = enable_chunked_context
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
            if not 0.0 < kv_cache_free_gpu_memory_fraction <= 1.0:
                raise UserError(f"--kv_cache_free_gpu_memory_fraction must be in (0, 1], "
                                f"got {kv_cache_free_gpu_memory_fraction}")
            kwargs["kv_cache_free_gpu_memory_fraction"] = kv_cache_free_gpu_memory_fraction
        if max_tokens_in_paged_kv_cache is not None:
            if max_tokens_in_paged_kv_cache < 1:
                raise UserError(f"--max_tokens_in_paged_kv_cache must be at least 1, got {max_tokens_in_paged_kv_cache}")
            kwargs["max_tokens_in_paged_kv_cache"] = max_tokens_in_paged_kv_cache
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

    def describe(self) -> dict[str, Any]:
        """Where and how it runs (:meth:`~..base.Runner.describe`): TensorRT-LLM's GPUs."""
        return {"device": "trtllm", "dtype": None, "cuda_graphs": False, "compile": None}

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
        if mode is not None and not is_draft_tokens_external(mode):
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
            raise UserError("prompt lookup on TensorRT-LLM needs KV block reuse; drop --no-kv_cache_enable_block_reuse "
                            "(or pass --kv_cache_enable_block_reuse)")

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
        validate_batch(batch, self.limits, max_new_tokens=max_new_tokens, resubmitted=True)
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
        draft: DraftConfig | None,
        max_new_tokens: int,
        end_id: int,
        sampling: SamplingConfig = SamplingConfig(),
        on_step: StepCallback | None = None,
        lookahead: Any = None,
        drafter: Any = None,
    ) -> list[SequenceResult]:
        """V2 (single call) for ``decoding.generate``: delegates to :class:`TrtllmLookupGenerator`
        (NGram drafting with ``draft``, or TensorRT-LLM's own Lookahead with ``lookahead``).

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
        if self.device_ids != list(range(self.config.world_size)):
            raise UserError(
                f"device list {self.device_ids}: TensorRT-LLM's LLM API (v2) places its ranks on the visible GPUs "
                f"itself; set CUDA_VISIBLE_DEVICES={','.join(map(str, self.device_ids))} and pass "
                "--prompt_lookup_config \"[k,n]\", or use --workflow v1"
            )
        if self._lookup is None:
            cls = self._lookup_generator_cls or TrtllmLookupGenerator
            self._lookup = cls(
                self.hf_model_dir,
                tensor_parallel_size=self.config.tp_size,
                pipeline_parallel_size=self.config.pp_size,
                max_batch_size=self.limits.max_batch_size,
                max_seq_len=self.limits.max_seq_len,
                kv_cache_free_gpu_memory_fraction=self.kv_cache_free_gpu_memory_fraction,
                max_tokens_in_paged_kv_cache=self.max_tokens_in_paged_kv_cache,
                enable_chunked_context=self.enable_chunked_context,
            )
        extra = {} if drafter is None else {"drafter": drafter}
        return self._lookup.generate(
            prompts, max_new_tokens=max_new_tokens, end_id=end_id, draft=draft, sampling=sampling, on_step=on_step,
            lookahead=lookahead, **extra,
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
                    drafted=len(draft),
                    accepted=common_prefix_len(draft, new),
                    finished=finished,
                )
            )
        return results


__all__ = ["TrtllmRunner"]
