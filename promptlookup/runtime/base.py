"""The runner interface: what the decoding loops need from a backend.

Both backends (PyTorch in :mod:`promptlookup.runtime.torch_runner`, TensorRT-LLM in
:mod:`promptlookup.runtime.trtllm`) implement :class:`Runner`. The V1 orchestrator
loop (:mod:`promptlookup.decoding.orchestrator`) is written against this interface only,
so one loop drives both runners.

``generate`` follows TensorRT-LLM's ``ModelRunnerCpp.generate`` in orchestrator mode: each
call receives whole sequences (prompt plus everything accepted so far) and, optionally,
one external draft per sequence. With drafts, the runner verifies them in one forward pass
and returns the longest agreeing prefix of each draft followed by one token of the
target's own; drafts may differ in length across the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from ..errors import UserError

if TYPE_CHECKING:
    from .batch_costs import BatchStepCosts
    from .kv_cache import BlockManager, KVPool, SequenceBlocks
    from .results import SequenceResult, StepCallback, TokenLogprob
    from .tree import DraftTree


@dataclass(frozen=True)
class SamplingConfig:
    """Token selection. ``temperature == 0`` (the default) means greedy decoding."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    random_seed: int = 0
    # Logits processors (TensorRT-LLM's semantics, see :mod:`.logits_processors`); the
    # defaults are neutral. Counted over the whole sequence so far, prompt included.
    repetition_penalty: float = 1.0  # seen tokens: logit / p if positive, logit * p if negative
    presence_penalty: float = 0.0  # subtracted once from every seen token
    frequency_penalty: float = 0.0  # subtracted per occurrence of a seen token
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never produced
    stop_words: tuple[tuple[int, ...], ...] = ()  # a sequence ends once its text ends with one
    # More end tokens (vLLM's and TensorRT-LLM's stop_token_ids): a sequence ends after the first,
    # kept in its output as end_id is; banned with end_id before min_tokens
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to the raw logits (OpenAI's logit_bias)
    min_tokens: int = 0  # end_id (and stop_token_ids) banned until the sequence has this many output tokens
    # Log-probabilities of the emitted tokens (:mod:`.logprobs`: the raw logits', before every
    # setting above): None for none, else this many top alternatives per token (0: the token's only).
    # Changes no token; the step groups requests without it, so it never splits a forward pass.
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_logits_processors(self) -> bool:
        """Whether any penalty, bad word, logit bias or ``min_tokens`` changes the logits (stop words do not)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or bool(self.bad_words) or bool(self.logit_bias)
                or self.min_tokens > 0)


@dataclass
class GenerationOutput:
    """One sequence's raw outcome of one ``Runner.generate`` call: the runner level, below
    the two result types of :mod:`.results`. With drafts it is one verification step, whose
    counters the V1 loop folds into a :class:`~.results.StepEvent` (``RequestState.commit``);
    nothing sums these across calls.

    Invariant: ``accepted <= drafted``, and ``output_ids`` starts with the ``accepted``
    draft tokens kept.
    """

    output_ids: list[int]  # the new tokens only (accepted drafts, then the target's own)
    drafted: int = 0  # draft tokens offered
    accepted: int = 0  # draft tokens kept
    finished: bool = False  # end_id produced (output_ids ends with it)
    choices: list[int] = field(default_factory=list)  # tree steps: the target's choice at the root and every node


@dataclass(frozen=True)
class EngineLimits:
    """Limits fixed when the engine was built (TensorRT-LLM's build_config names)."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    vocab_size: int


def validate_batch(
    prompts: Sequence[Sequence[int]],
    limits: EngineLimits,
    *,
    max_new_tokens: int | None = None,
    resubmitted: bool = False,
) -> None:
    """Check a batch against the engine limits; bad input is a one-line UserError.

    The one place the batch limits are checked (the loops, both runners and the server call
    it): at most ``max_batch_size`` sequences, none empty, every token in the vocabulary;
    fresh prompts within ``max_input_len`` (``resubmitted``: whole sequences, prompt plus
    output so far, as V1 sends them, which only ``max_seq_len`` bounds); with
    ``max_new_tokens``, room for that many more tokens within ``max_seq_len``.
    """
    if len(prompts) > limits.max_batch_size:
        raise UserError(
            f"batch of {len(prompts)} exceeds the engine's max_batch_size {limits.max_batch_size}; "
            "pass fewer prompts or rebuild with a larger --max_batch_size"
        )
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise UserError(f"prompt {i} is empty; give at least one token")
        if not resubmitted and len(p) > limits.max_input_len:
            raise UserError(
                f"prompt {i} has {len(p)} tokens, more than the engine's max_input_len {limits.max_input_len}; "
                "shorten it or rebuild with a larger --max_input_len"
            )
        if max_new_tokens is not None and len(p) + max_new_tokens > limits.max_seq_len:
            what = "sequence" if resubmitted else "prompt"
            raise UserError(
                f"{what} {i} ({len(p)} tokens) plus {max_new_tokens} new tokens exceeds the engine's max_seq_len "
                f"{limits.max_seq_len}; lower --max_output_len (max_tokens) or rebuild with a larger --max_seq_len"
            )
        bad = [t for t in p if not 0 <= t < limits.vocab_size]
        if bad:
            raise UserError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {limits.vocab_size})")


@dataclass
class RunnerStats:
    """Counters a runner keeps across calls (for tests and reports)."""

    forward_calls: int = 0
    forward_tokens: int = 0  # tokens actually run through the model
    reused_tokens: int = 0  # prompt tokens served from cached KV blocks


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner can do beyond :meth:`Runner.generate`'s chain verification. Each runner
    declares its own; the decoding loops and the scripts read only this, never the class.
    A capability promises the matching protocol below.

    - ``live_batch``: a :class:`LiveBatchRunner`: ``open()`` gives a live :class:`LiveBatch`
      (the V2 single-call loop and continuous batching run inside this project);
    - ``token_trees``: a :class:`TreeRunner`, verifying draft trees
      (``generate(draft_trees=...)``, ``step_trees``): several candidates per step and Lookahead;
    - ``logits_processors``: penalties and bad words at every verified position;
    - ``own_speculation``: a :class:`SelfSpeculatingRunner`: ``generate_lookup()`` runs the
      backend's own single-call speculation (TensorRT-LLM's LLM API: NGram drafting or Lookahead).
    """

    live_batch: bool = False
    token_trees: bool = False
    logits_processors: bool = False
    own_speculation: bool = False


class Runner(Protocol):
    limits: EngineLimits
    capabilities: RunnerCapabilities
    step_cost_table: list[float] | None  # relative step cost by tokens fed (None: none stored)

    def describe(self) -> dict[str, Any]:
        """Where and how it runs, for logs and reports: ``device`` (a string), ``dtype``
        (a string, or None for an engine's own), ``cuda_graphs`` (bool) and ``compile``
        (the compile set-up's JSON, or None)."""

    def generate(
        self,
        batch_input_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        end_id: int,
        draft_tokens_list: Sequence[Sequence[int]] | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        request_ids: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        """Continue each sequence; with drafts, verify them and return accepted + 1 token.

        ``request_ids`` names each sequence's request (stable while a batch shrinks); it
        keys the sampling random stream so that speculative and plain sampling agree.
        """


class StepOutput(Protocol):
    """One sequence's outcome of one live-batch step (:meth:`LiveBatch.step_trees`)."""

    tokens: list[int]  # accepted draft tokens, then the target's own token (cut at end_id)
    accepted: int  # the first ``accepted`` of ``tokens`` came from the tree
    finished: bool  # ``tokens`` ends with end_id
    choices: list[int]  # the target's choice at the root, then at every node
    logprobs: "list[TokenLogprob] | None"  # per token of ``tokens``, where the step asked for them


class LiveSequenceView(Protocol):
    """What a live batch shows of one sequence: its block table and tokens so far."""

    blocks: "SequenceBlocks"
    tokens: list[int]  # prompt, then output
    prompt_len: int


class LiveBatch(Protocol):
    """Sequences that keep their KV blocks between steps (the V2 loop and the scheduler)."""

    seqs: "Sequence[LiveSequenceView | None]"  # by slot (None: a free slot)

    def step_trees(self, indices: Sequence[int], trees: Sequence["DraftTree"], end_id: int,
                   sampling: SamplingConfig, logprobs: Sequence[int | None] | None = None) -> Sequence[StepOutput]:
        """Verify ``trees[j]`` for sequence ``indices[j]`` in one forward pass and commit
        each sequence's accepted path; with ``logprobs[j]`` not None, sequence ``j``'s tokens
        come with their log-probabilities and that many top alternatives (``sampling.logprobs``
        is not read here: one pass serves requests that ask and requests that do not)."""

    def add(self, prompt: Sequence[int], request: int) -> int:
        """Join a sequence between steps; returns its slot."""

    def remove(self, index: int) -> Any:
        """Leave between steps, releasing its KV blocks."""

    def close(self) -> None:
        """Release every sequence's KV blocks."""


class TreeRunner(Runner, Protocol):
    """A runner whose ``generate`` also verifies token trees (``capabilities.token_trees``)."""

    def generate(
        self,
        batch_input_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        end_id: int,
        draft_tokens_list: Sequence[Sequence[int]] | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        request_ids: Sequence[int] | None = None,
        draft_trees: Sequence["DraftTree"] | None = None,
    ) -> list[GenerationOutput]:
        """As :meth:`Runner.generate`; with ``draft_trees``, one tree step per sequence whose
        outputs carry the target's ``choices``."""


class LiveBatchRunner(TreeRunner, Protocol):
    """A runner that opens live batches (``capabilities.live_batch``) over a paged KV pool."""

    pool: "KVPool"  # num_blocks, block_size: what the scheduler reserves at admission
    blocks: "BlockManager"  # the pool's prefix-reuse registry: the scheduler's admission reads it
    batch_step_costs: "BatchStepCosts | None"  # batched steps' costs (the server's draft budget)
    skips_padding: bool  # a batched step computes its real rows only: the draft budget prices it by its rows

    def open(self, prompts: Sequence[Sequence[int]], requests: Sequence[int] | None = None, *,
             max_new_tokens: int | None = None, resubmitted: bool = False) -> LiveBatch:
        """Start a live batch of ``prompts`` (``requests`` key their sampling noise)."""


class SelfSpeculatingRunner(Runner, Protocol):
    """A runner that speculates by itself in one call (``capabilities.own_speculation``:
    TensorRT-LLM's V2, NGram drafting or Lookahead inside the backend)."""

    def validate_lookup(self, k: int, device_ids: Sequence[int] | None = None) -> None:
        """Refuse (one line) prompt lookup with drafts of up to ``k`` tokens on these
        devices (TensorRT-LLM's engine and device requirements; every run already holds
        ``k`` to ``max_draft_len``)."""

    def generate_lookup(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        draft: Any,
        max_new_tokens: int,
        end_id: int,
        sampling: SamplingConfig = SamplingConfig(),
        on_step: "StepCallback | None" = None,
        lookahead: Any = None,
        drafter: Any = None,
    ) -> list["SequenceResult"]:
        """Generate with the backend's own speculation (``draft``: the DraftConfig, or
        ``lookahead``); ``drafter``: this side's drafter, run inside the backend."""
