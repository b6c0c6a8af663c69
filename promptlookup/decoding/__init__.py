"""Prompt-lookup decoding loops: V1 (orchestrator) and V2 (single call), one entry point."""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import DraftConfig, Drafter
from ..errors import UserError
from ..runtime.base import Runner, SamplingConfig, validate_batch
from .orchestrator import run_orchestrator
from .result import SequenceResult, StepCallback, StepEvent

WORKFLOWS = ("v1", "v2")
DRAFT_LENGTH_POLICIES = ("cost", "full")

__all__ = ["generate", "SequenceResult", "StepEvent", "StepCallback", "WORKFLOWS"]


def generate(
    runner: Runner,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    end_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    draft: DraftConfig | None = None,
    workflow: str = "v2",
    on_step: StepCallback | None = None,
    drafter: Drafter | None = None,
    draft_length_policy: str = "cost",
) -> list[SequenceResult]:
    """Generate for a batch of token-id prompts.

    Drafts come from ``drafter`` when given (to share its public pool and caches across
    calls), else from a drafter made from ``draft``; with neither, this is plain decoding.

    ``draft_length_policy="cost"`` verifies, per step, only the prefix of each draft that
    is expected to pay off on this runner (:mod:`.draft_policy`; runners that report no
    step costs get full drafts); ``"full"`` always verifies the whole draft, as
    TensorRT-LLM does. Neither changes the output tokens.
    """
    if draft_length_policy not in DRAFT_LENGTH_POLICIES:
        raise UserError(f"unknown draft length policy {draft_length_policy!r}; choose cost or full")
    if workflow not in WORKFLOWS:
        raise UserError(f"unknown workflow {workflow!r}; choose v1 or v2")
    if max_new_tokens < 1:
        raise UserError(f"max_output_len must be at least 1, got {max_new_tokens}")
    limits = runner.limits
    validate_batch(prompts, limits)
    for i, p in enumerate(prompts):
        if len(p) + max_new_tokens > limits.max_seq_len:
            raise UserError(
                f"prompt {i} ({len(p)} tokens) plus max_output_len {max_new_tokens} exceeds the engine's "
                f"max_seq_len {limits.max_seq_len}; lower --max_output_len or rebuild with a larger --max_seq_len"
            )
    if drafter is None and draft is not None:
        from ..drafting import make_drafter

        drafter = make_drafter(draft)
    config = getattr(drafter, "config", None) or draft
    if drafter is not None and config is not None:
        k = config.prompt_lookup_num_tokens
        if k > limits.max_draft_len:
            raise UserError(
                f"prompt_lookup_num_tokens {k} exceeds the engine's max_draft_len {limits.max_draft_len}; "
                f"lower k or rebuild with --max_draft_len {k}"
            )

    from ..runtime.torch_runner import TorchRunner

    kwargs = dict(max_new_tokens=max_new_tokens, end_id=end_id, sampling=sampling, on_step=on_step)
    if drafter is not None and draft_length_policy == "cost" and hasattr(runner, "step_costs"):
        k = config.prompt_lookup_num_tokens if config is not None else limits.max_draft_len
        kwargs["step_costs"] = runner.step_costs(min(k, limits.max_draft_len) + 1)
    if isinstance(runner, TorchRunner):
        if workflow == "v2" or drafter is None:
            from .single_call import run_single_call

            return run_single_call(runner, prompts, drafter=drafter, **kwargs)
        return run_orchestrator(runner, prompts, drafter=drafter, **kwargs)
    if workflow == "v2" and drafter is not None:
        lookup = getattr(runner, "generate_lookup", None)
        if lookup is None:
            raise UserError("this backend has no single-call (v2) prompt lookup; use --workflow v1")
        if config is not None and config.min_matching_ngram_size > 1:
            raise UserError("TensorRT-LLM's own (v2) n-gram drafter has no minimum match length; "
                            "drop --prompt_lookup_min_ngram or use --workflow v1")
        kwargs.pop("step_costs", None)
        return lookup(prompts, draft=config, **kwargs)
    return run_orchestrator(runner, prompts, drafter=drafter, **kwargs)
