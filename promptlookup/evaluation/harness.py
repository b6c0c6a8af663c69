"""Running one contender over batches of prompts, with warm-up-aware timing and progress.

A contender is anything that maps a batch of prompts to :class:`Generated` records (our
engine, plain or speculative; Hugging Face, plain or prompt lookup). :func:`run_batches`
calls it once per batch and times each call with an injectable clock.

Timing rule: the first ``warmup_batches`` batches are a warm-up (allocator, kernels,
caches) and are excluded from latency, token counts for throughput, and tokens/s; their
outputs are still kept and scored, so every contender is scored on the same articles.
TensorRT-LLM's ``summarize.py`` instead runs a separate unscored warm-up on the first
article and then times every batch; we avoid decoding that article twice.

A tqdm bar (on stderr, shown on terminals only) counts articles and shows a live tokens/s
over the timed part of the run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

ProgressHook = Callable[[int], None]  # called with the number of tokens just generated
BatchFn = Callable[[list[list[int]], ProgressHook], list["Generated"]]
Clock = Callable[[], float]


@dataclass
class Generated:
    """One prompt's output: new tokens plus acceptance counters (None when unknown)."""

    output_ids: list[int]
    steps: int | None = None  # target forward passes (verification steps)
    drafted: int | None = None  # draft tokens offered
    accepted: int | None = None  # draft tokens kept


@dataclass
class RunRecord:
    """Everything measured while one contender ran over all batches.

    Invariants: ``len(batch_seconds) == len(batch_tokens) == len(batch_sizes)``;
    ``sum(batch_sizes) == len(outputs)``; outputs are in prompt order.
    """

    name: str
    outputs: list[Generated] = field(default_factory=list)
    batch_seconds: list[float] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    warmup_batches: int = 1

    @property
    def timed_batches(self) -> int:
        return max(0, len(self.batch_seconds) - self.warmup_batches)

    @property
    def timed_seconds(self) -> float:
        return sum(self.batch_seconds[self.warmup_batches:])

    @property
    def timed_tokens(self) -> int:
        return sum(self.batch_tokens[self.warmup_batches:])

    @property
    def tokens_per_second(self) -> float | None:
        """Generated tokens per second over the timed batches; None when none was timed."""
        if self.timed_batches == 0 or self.timed_seconds <= 0:
            return None
        return self.timed_tokens / self.timed_seconds


def batched(items: Sequence, batch_size: int) -> list[list]:
    """Consecutive slices of ``items`` of ``batch_size`` (the last may be shorter)."""
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    return [list(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]


def run_batches(
    name: str,
    generate_batch: BatchFn,
    prompt_batches: Sequence[Sequence[Sequence[int]]],
    *,
    warmup_batches: int = 1,
    clock: Clock = time.perf_counter,
    progress: bool | None = None,
) -> RunRecord:
    """Run ``generate_batch`` on every batch in order and record outputs and timings.

    ``progress``: True always shows the bar, False never, None only on a terminal.
    Cost: one ``generate_batch`` call per batch plus O(1) bookkeeping per progress event.
    """
    from tqdm import tqdm

    record = RunRecord(name=name, warmup_batches=warmup_batches)
    total = sum(len(b) for b in prompt_batches)
    bar = tqdm(total=total, desc=name, unit="article", disable=(None if progress is None else not progress),
               leave=True, dynamic_ncols=True)
    try:
        for index, batch in enumerate(prompt_batches):
            timed = index >= warmup_batches
            live_tokens = 0
            start = clock()

            def hook(n_tokens: int) -> None:
                nonlocal live_tokens
                live_tokens += n_tokens
                if bar.disable:
                    return
                if not timed:
                    bar.set_postfix_str("warm-up (untimed)", refresh=False)
                    return
                seconds = record.timed_seconds + (clock() - start)
                if seconds > 0:
                    bar.set_postfix_str(f"{(record.timed_tokens + live_tokens) / seconds:.1f} tok/s", refresh=False)

            outputs = generate_batch([list(p) for p in batch], hook)
            elapsed = clock() - start
            if len(outputs) != len(batch):
                raise RuntimeError(f"{name}: {len(outputs)} outputs for a batch of {len(batch)} prompts")
            record.outputs.extend(outputs)
            record.batch_seconds.append(elapsed)
            record.batch_tokens.append(sum(len(o.output_ids) for o in outputs))
            record.batch_sizes.append(len(batch))
            if not bar.disable and record.tokens_per_second is not None:
                bar.set_postfix_str(f"{record.tokens_per_second:.1f} tok/s", refresh=False)
            bar.update(len(batch))
    finally:
        bar.close()
    return record
