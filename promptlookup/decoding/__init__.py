"""Prompt-lookup decoding loops: V1 (orchestrator) and V2 (single call), one entry point.

The loop is picked from the runner's capabilities in one table (:data:`LOOPS`); see
docs/architecture.md for the step every loop runs.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..defaults import DEFAULT_DRAFT_LENGTH_POLICY, DEFAULT_WORKFLOW, DRAFT_LENGTH_POLICIES, WORKFLOWS
from ..drafting.base import DraftConfig, Drafter, WorkflowDrafter
from ..drafting.drafter import NgramDrafter
from ..errors import UserError
from ..runtime.base import Runner, RunnerCapabilities, SamplingConfig, validate_batch
from ..runtime.results import SequenceResult, StepCallback, StepEvent
from .lookahead import LookaheadConfig, step_tokens
from .orchestrator import run_orchestrator

__all__ = ["generate", "drafter_for", "LookaheadConfig", "SequenceResult", "StepEvent", "StepCallback", "WORKFLOWS"]


def _check_drafter_workflow(drafter: Drafter | None, workflow: str) -> None:
    """A drafter made for the other workflow would draft by the other workflow's pool rules."""
    if (isinstance(drafter, WorkflowDrafter) and drafter.config.mode == "pool" and drafter.config.pool_rules == "auto"
            and drafter.workflow != workflow):
        raise UserError(
            f"the drafter was made for workflow {drafter.workflow} but generation uses {workflow}; "
            f"pass make_drafter(..., workflow={workflow!r}) or choose pool_rules explicitly"
        )


def drafter_for(draft: DraftConfig | None, capabilities: RunnerCapabilities, *, workflow: str, end_id: int | None,
                tokenizer: Any = None) -> NgramDrafter | None:
    """The one place a run's drafter is made (``generate`` when given none, and ``run.py``).

    None without ``draft``, and under v2 on a runner that speculates by itself
    (TensorRT-LLM drafts inside itself) unless persisted n-gram caches need this side's
    drafter to run there, which only a ``tokenizer`` can identify (run.py gives it).
    """
    if draft is None:
        return None
    caches = bool(draft.static_cache or draft.dynamic_cache) and tokenizer is not None
    if workflow == "v2" and capabilities.own_speculation and not caches:
        return None
    from ..drafting import make_drafter

    return make_drafter(draft, tokenizer, workflow=workflow, end_id=end_id)


def _single_call(runner: Any, prompts: Any, **kw: Any) -> list[SequenceResult]:
    from .single_call import run_single_call

    kw.pop("trees")
    kw.pop("draft")
    return run_single_call(runner, prompts, **kw)


def _own_speculation(runner: Any, prompts: Any, *, draft: DraftConfig | None, drafter: Drafter | None,
                     lookahead: LookaheadConfig | None, sampling: SamplingConfig, **kw: Any) -> list[SequenceResult]:
    if sampling.stop_token_ids:
        raise UserError("stop token ids are not passed to TensorRT-LLM's own speculation; use --workflow v1")
    if lookahead is None and sampling.stop_words:
        raise UserError("stop words need the orchestrator loop on this backend; use --workflow v1")
    for k in ("trees", "step_costs", "max_candidates"):
        kw.pop(k)
    extra = {"lookahead": lookahead} if lookahead is not None else {"drafter": drafter} if drafter is not None else {}
    return runner.generate_lookup(prompts, draft=draft, sampling=sampling, **extra, **kw)


def _no_single_call(runner: Any, prompts: Any, **kw: Any) -> list[SequenceResult]:
    raise UserError("this backend has no single-call (v2) prompt lookup; use --workflow v1")


def _orchestrator(runner: Any, prompts: Any, *, draft: Any, **kw: Any) -> list[SequenceResult]:
    if kw["sampling"].min_tokens:  # V1 resubmits whole sequences: the runner cannot tell output from prompt
        raise UserError("min_tokens needs the live batch (--workflow v2); V1 resubmits whole sequences")
    return run_orchestrator(runner, prompts, **kw)


def _check_logprobs(logprobs: int, loop: Callable[..., Any]) -> None:
    """Log-probabilities come from the live batch's verification step (runtime.logprobs):
    refused, not ignored, on every other loop."""
    from ..runtime.logprobs import MAX_TOP_LOGPROBS

    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise UserError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] (top alternatives per token), "
                        f"got {logprobs!r}")
    if loop is not _single_call:
        raise UserError("log-probabilities are computed by the PyTorch runtime's live batch only; "
                        "use --workflow v2 on a PyTorch engine, or drop logprobs")


Loop = Callable[..., list[SequenceResult]]
# (workflow, the runner's kind, speculating) -> the loop. Kinds: "live" (opens live batches:
# V2's single call runs here, and plain decoding always does), "own" (speculates by itself:
# TensorRT-LLM's V2), "call" (a Runner.generate per step only).
LOOPS: dict[tuple[str, str, bool], Loop] = {
    ("v2", "live", True): _single_call, ("v2", "live", False): _single_call,
    ("v1", "live", True): _orchestrator, ("v1", "live", False): _single_call,
    ("v2", "own", True): _own_speculation, ("v2", "own", False): _orchestrator,
    ("v1", "own", True): _orchestrator, ("v1", "own", False): _orchestrator,
    ("v2", "call", True): _no_single_call, ("v2", "call", False): _orchestrator,
    ("v1", "call", True): _orchestrator, ("v1", "call", False): _orchestrator,
}


def _kind(caps: RunnerCapabilities) -> str:
    return "live" if caps.live_batch else "own" if caps.own_speculation else "call"


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
    (:func:`drafter_for`; ``pool_rules="auto"`` then means V1's pool for v1 and V2's for
    v2); with neither (and no ``lookahead``), this is plain decoding.

    ``DraftConfig.max_candidates > 1`` verifies several prompt-lookup candidates per step as
    one token tree; ``lookahead`` runs Lookahead decoding (with prompt lookup too when a drafter is
    given). Both verify token trees, which the PyTorch runner does in either workflow.

    ``draft_length_policy="cost"`` (the default, :mod:`promptlookup.defaults`) sizes each
    step's draft (or tree) from the runner's step-cost table, measured when the engine was
    built (:mod:`.draft_policy`; a runner without a table gets full drafts); ``"full"``
    always verifies everything proposed, as TensorRT-LLM does. Neither changes the output
    tokens, and neither times anything.
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
    if drafter is None:
        drafter = drafter_for(draft, caps, workflow=workflow, end_id=end_id)
    _check_drafter_workflow(drafter, workflow)
    if drafter is not None and not isinstance(drafter.config, DraftConfig):
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
    speculating = config is not None or lookahead is not None
    own_lookahead = lookahead is not None and not caps.token_trees and workflow == "v2" and caps.own_speculation
    if tree_mode and not caps.token_trees and not own_lookahead:
        what = "--lookahead_config" if lookahead is not None else "several draft candidates"
        raise UserError(f"{what} on this backend needs --workflow v2 (TensorRT-LLM's own Lookahead) "
                        "or a PyTorch engine, whose runtime verifies token trees")
    step_costs = None
    if (drafter is not None or lookahead is not None) and draft_length_policy == "cost":
        step_costs = runner.step_cost_table
    if sampling.has_logits_processors and not caps.logits_processors and not own_lookahead:
        raise UserError("repetition/presence/frequency penalties and bad words are applied at every verified position "
                        "by the PyTorch runtime only; drop them or use a PyTorch engine")
    loop = LOOPS[(workflow, _kind(caps), speculating and (drafter is not None or lookahead is not None
                                                          or caps.own_speculation))]
    if sampling.logprobs is not None:
        _check_logprobs(sampling.logprobs, loop)
    return loop(runner, prompts, max_new_tokens=max_new_tokens, end_id=end_id, sampling=sampling, on_step=on_step,
                drafter=drafter, draft=config, max_candidates=max_candidates, lookahead=lookahead,
                trees=tree_mode, step_costs=step_costs)
