"""Prompt-lookup decoding loops: V1 (orchestrator) and V2 (single call), one entry point."""
from __future__ import annotations

from typing import Sequence

from ..defaults import DEFAULT_DRAFT_LENGTH_POLICY, DEFAULT_WORKFLOW, DRAFT_LENGTH_POLICIES, WORKFLOWS
from ..drafting.base import DraftConfig, Drafter
from ..errors import UserError
from ..runtime.base import Runner, SamplingConfig, validate_batch
from .lookahead import LookaheadConfig, step_tokens
from .orchestrator import run_orchestrator
from ..runtime.results import SequenceResult, StepCallback, StepEvent

__all__ = ["generate", "LookaheadConfig", "SequenceResult", "StepEvent", "StepCallback", "WORKFLOWS"]


def _check_drafter_workflow(drafter: Drafter | None, workflow: str) -> None:
    """A drafter made for the other workflow would draft by the other workflow's pool rules."""
    from ..drafting import NgramDrafter

    if (isinstance(drafter, NgramDrafter) and drafter.config.mode == "pool" and drafter.config.pool_rules == "auto"
            and drafter.workflow != workflow):
        raise UserError(
            f"the drafter was made for workflow {drafter.workflow} but generation uses {workflow}; "
            f"pass make_drafter(..., workflow={workflow!r}) or choose pool_rules explicitly"
        )


def generate(
    runner: Runner,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    end_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    draft: DraftConfig | None = None,
    workflow: str = DEFAULT_WORKFLOW,
    on_step: StepCallback | None = None,
    drafter: Drafter | None = None,
    draft_length_policy: str = DEFAULT_DRAFT_LENGTH_POLICY,
    lookahead: LookaheadConfig | None = None,
) -> list[SequenceResult]:
    """Generate for a batch of token-id prompts.

    Drafts come from ``drafter`` when given (to share its public pool and caches across
    calls), else from a drafter made from ``draft`` for this ``workflow`` and ``end_id``
    (``pool_rules="auto"`` then means V1's pool for v1 and V2's for v2); with neither (and
    no ``lookahead``), this is plain decoding.

    ``DraftConfig.max_candidates > 1`` verifies several prompt-lookup candidates per step as
    one token tree; ``lookahead`` runs Lookahead decoding (with prompt lookup too when a drafter is
    given). Both verify token trees, which the PyTorch runner does in either workflow.

    ``draft_length_policy="cost"`` sizes each step's draft (or tree) from the runner's
    step-cost table, measured when the engine was built (:mod:`.draft_policy`; a runner
    without a table gets full drafts); ``"full"`` always verifies everything proposed, as
    TensorRT-LLM does. Neither changes the output tokens, and neither times anything.
    """
    if draft_length_policy not in DRAFT_LENGTH_POLICIES:
        raise UserError(f"unknown draft length policy {draft_length_policy!r}; choose cost or full")
    if workflow not in WORKFLOWS:
        raise UserError(f"unknown workflow {workflow!r}; choose v1 or v2")
    if max_new_tokens < 1:
        raise UserError(f"max_output_len must be at least 1, got {max_new_tokens}")
    limits = runner.limits
    validate_batch(prompts, limits, max_new_tokens=max_new_tokens)
    caps = runner.capabilities
    if drafter is None and draft is not None and not (workflow == "v2" and caps.own_speculation):
        from ..drafting import make_drafter

        drafter = make_drafter(draft, workflow=workflow, end_id=end_id)
    _check_drafter_workflow(drafter, workflow)
    if drafter is not None and not isinstance(getattr(drafter, "config", None), DraftConfig):
        raise TypeError(f"drafter must be a Drafter (make_drafter), got {type(drafter).__name__}")
    config = drafter.config if drafter is not None else draft
    if config is not None:
        k = config.prompt_lookup_num_tokens
        if k > limits.max_draft_len:
            raise UserError(
                f"prompt_lookup_num_tokens {k} exceeds the engine's max_draft_len {limits.max_draft_len}; "
                f"lower k or rebuild with --max_draft_len {k}"
            )
    from ..drafting.concurrency import refuse_unrouted

    refuse_unrouted(config, inside_tensorrt_llm=workflow == "v2" and caps.own_speculation)
    if lookahead is not None and caps.token_trees:  # this project's engine rule (TensorRT-LLM checks its own)
        need = step_tokens(lookahead, config.prompt_lookup_num_tokens if config is not None else 0)
        if need > limits.max_draft_len:
            w, n, g = lookahead.triple
            raise UserError(
                f"--lookahead_config [{w},{n},{g}] feeds up to {need} draft tokens per step, more than the engine's "
                f"max_draft_len {limits.max_draft_len}; rebuild with --max_draft_len {need} or use a smaller [W,N,G]"
            )

    max_candidates = config.max_candidates if drafter is not None and config is not None else 1
    tree_mode = lookahead is not None or (max_candidates > 1 and drafter is not None)
    if lookahead is not None and not caps.token_trees and workflow == "v2" and caps.own_speculation:
        return runner.generate_lookup(prompts, draft=config, lookahead=lookahead,
                                      max_new_tokens=max_new_tokens, end_id=end_id, sampling=sampling,
                                      on_step=on_step)
    if tree_mode and not caps.token_trees:
        what = "--lookahead_config" if lookahead is not None else "several draft candidates"
        raise UserError(f"{what} on this backend needs --workflow v2 (TensorRT-LLM's own Lookahead) "
                        "or a PyTorch engine, whose runtime verifies token trees")
    kwargs = dict(max_new_tokens=max_new_tokens, end_id=end_id, sampling=sampling, on_step=on_step)
    if (drafter is not None or lookahead is not None) and draft_length_policy == "cost":
        kwargs["step_costs"] = runner.step_cost_table
    if sampling.has_logits_processors and not caps.logits_processors:
        raise UserError("repetition/presence/frequency penalties and bad words are applied at every verified position "
                        "by the PyTorch runtime only; drop them or use a PyTorch engine")
    if caps.live_batch and (workflow == "v2" or (drafter is None and lookahead is None)):
        from .single_call import run_single_call

        return run_single_call(runner, prompts, drafter=drafter, max_candidates=max_candidates,
                               lookahead=lookahead, **kwargs)
    if workflow == "v2" and config is not None:
        if not caps.own_speculation:
            raise UserError("this backend has no single-call (v2) prompt lookup; use --workflow v1")
        kwargs.pop("step_costs", None)
        if sampling.stop_words:
            raise UserError("stop words need the orchestrator loop on this backend; use --workflow v1")
        if drafter is not None:  # runs inside the backend where its own drafter cannot keep the settings
            kwargs["drafter"] = drafter
        return runner.generate_lookup(prompts, draft=config, **kwargs)
    return run_orchestrator(runner, prompts, drafter=drafter, max_candidates=max_candidates,
                            lookahead=lookahead, trees=tree_mode, **kwargs)
