"""Turning a :class:`~promptlookup.evaluation.harness.RunRecord` into the reported numbers.

Per contender: ROUGE (all articles, warm-up included), timing (timed batches only, see
:mod:`~promptlookup.evaluation.harness`), acceptance (all articles: verification steps,
tokens per step, drafted/accepted), and for speculative runs whether each output is
token-identical to the plain run of the same family, plus the throughput speedup over it.

Identity is only a correctness check under greedy decoding, where prompt lookup must not
change the output; under sampling it is reported but expected to differ.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .dataset import Article
from .harness import RunRecord
from .rouge import compute_rouge

Decode = Callable[[list[int]], str]


@dataclass
class ContenderReport:
    """The reported numbers of one contender (``to_dict`` is the JSON form)."""

    name: str
    family: str
    speculative: bool
    draft: dict[str, Any] | None
    workflow: str | None
    rouge: dict[str, float]
    latency_s: float
    generated_tokens: int  # in the timed batches
    tokens_per_s: float | None
    timed_batches: int
    warmup_batches: int
    total_generated_tokens: int  # all batches, warm-up included
    steps: int | None
    tokens_per_step: float | None
    drafted: int | None
    accepted: int | None
    acceptance_rate: float | None
    identical: int | None = None  # outputs token-identical to the plain run of the same family
    compared: int | None = None
    speedup: float | None = None  # tokens/s over the plain run of the same family
    samples: list[dict[str, Any]] | None = None
    lookahead: list[int] | None = None  # [W, N, G] of a Lookahead run (with ``draft`` too: combined)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _sum_or_none(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def summarize_record(
    record: RunRecord,
    articles: Sequence[Article],
    decode: Decode,
    *,
    family: str,
    draft: dict[str, Any] | None = None,
    workflow: str | None = None,
    lookahead: Sequence[int] | None = None,
    plain: RunRecord | None = None,
    prompt_lengths: Sequence[int] | None = None,
    keep_samples: bool = True,
) -> ContenderReport:
    """Score and aggregate ``record``; ``plain`` (same family, same articles) enables identity and speedup.

    A run is speculative with a ``draft`` (prompt lookup) or a ``lookahead`` ([W, N, G]); only
    then is its ``workflow`` recorded (plain decoding is the same in either)."""
    outputs = record.outputs
    if len(outputs) != len(articles):
        raise ValueError(f"{record.name}: {len(outputs)} outputs for {len(articles)} articles")
    texts = [decode(o.output_ids) for o in outputs]
    rouge = compute_rouge(texts, [a.highlights for a in articles])
    total_tokens = sum(len(o.output_ids) for o in outputs)
    steps = _sum_or_none([o.steps for o in outputs])
    drafted = _sum_or_none([o.drafted for o in outputs])
    accepted = _sum_or_none([o.accepted for o in outputs])
    speculative = draft is not None or lookahead is not None
    report = ContenderReport(
        name=record.name,
        family=family,
        speculative=speculative,
        draft=draft,
        workflow=workflow if speculative else None,
        rouge=rouge,
        latency_s=record.timed_seconds,
        generated_tokens=record.timed_tokens,
        tokens_per_s=record.tokens_per_second,
        timed_batches=record.timed_batches,
        warmup_batches=min(record.warmup_batches, len(record.batch_seconds)),
        total_generated_tokens=total_tokens,
        steps=steps,
        tokens_per_step=(total_tokens / steps) if steps else None,
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=(accepted / drafted) if drafted and accepted is not None else None,
        lookahead=None if lookahead is None else list(lookahead),
    )
    same = None
    if plain is not None and plain is not record:
        same = [a.output_ids == b.output_ids for a, b in zip(outputs, plain.outputs)]
        report.identical, report.compared = sum(same), len(same)
        if record.tokens_per_second and plain.tokens_per_second:
            report.speedup = record.tokens_per_second / plain.tokens_per_second
    if keep_samples:
        report.samples = [
            {
                "id": article.id,
                "prompt_tokens": None if prompt_lengths is None else prompt_lengths[i],
                "output_text": texts[i],
                "output_ids": outputs[i].output_ids,
                "steps": outputs[i].steps,
                "drafted": outputs[i].drafted,
                "accepted": outputs[i].accepted,
                **({} if same is None else {"identical_to_plain": same[i]}),
            }
            for i, article in enumerate(articles)
        ]
    return report
