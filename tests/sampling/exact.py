"""Exact output distributions of a small model, and goodness-of-fit statistics.

The reference filter here is written independently of ``promptlookup.runtime.sampling``
(float64, one row at a time, by sorting), so a bug in the runtime's filter cannot hide in
the expected distribution. Semantics (documented in ``sampling.py``): temperature, then
top-k (keep the k largest), then top-p on the renormalised result (keep a token while the
probability mass strictly before it, in descending order, is below ``top_p``).

Enumeration cost: one batched forward per depth over every context of positive
probability, i.e. at most ``1 + V + V**2`` contexts for three tokens over a vocabulary V.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from promptlookup.runtime.base import SamplingConfig

Outcome = tuple[int, ...]  # the generated tokens, cut after end_id


def reference_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The filtered, tempered softmax of one row of logits, in float64 (independent code)."""
    x = logits.double() / sampling.temperature
    probs = torch.softmax(x, dim=-1)
    order = torch.argsort(x, descending=True).tolist()
    keep = order[: sampling.top_k] if sampling.top_k else order
    mass = sum(probs[i].item() for i in keep)
    kept, before = [], 0.0
    for i in keep:
        if sampling.top_p < 1.0 and before >= sampling.top_p:
            break
        kept.append(i)
        before += probs[i].item() / mass
    out = torch.zeros_like(probs)
    out[kept] = probs[kept]
    return out / out.sum()


@dataclass
class ExactTree:
    """The exact joint law of the next ``depth`` tokens after one prompt."""

    joint: dict[Outcome, float]  # outcome -> probability (only positive ones)
    argmax: dict[Outcome, int]  # context (tokens generated so far) -> the model's argmax next token


@torch.inference_mode()
def exact_tree(model, prompt: Sequence[int], sampling: SamplingConfig, depth: int, end_id: int,
               process: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None) -> ExactTree:
    """Enumerate every continuation of ``prompt`` up to ``depth`` tokens with the HF model.

    ``process(row, prefix)``, when given, transforms each row of logits before sampling,
    with ``prefix`` the whole sequence so far (penalties, bad words)."""
    joint: dict[Outcome, float] = {}
    argmax: dict[Outcome, int] = {}
    frontier: dict[Outcome, float] = {(): 1.0}
    for _ in range(depth):
        contexts = list(frontier)
        ids = torch.tensor([list(prompt) + list(c) for c in contexts])
        logits = model(ids).logits[:, -1, :]
        nxt: dict[Outcome, float] = {}
        for c, row in zip(contexts, logits):
            if process is not None:
                row = process(row, list(prompt) + list(c))
            argmax[c] = int(row.argmax())
            probs = reference_probs(row, sampling)
            for t in torch.nonzero(probs).flatten().tolist():
                p = frontier[c] * probs[t].item()
                (joint if t == end_id else nxt)[c + (t,)] = p
        frontier = nxt
    joint.update(frontier)
    return ExactTree(joint, argmax)


def chi2_sf(stat: float, df: int) -> float:
    """Upper tail of the chi-square distribution: P(X >= stat) for X ~ chi2(df)."""
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def _bins(expected: Mapping[Outcome, float], min_expected: float) -> list[list[Outcome]]:
    """Group outcomes so every bin expects at least ``min_expected`` counts.

    Outcomes expecting at least that many get a bin each; the rest are pooled into one
    "rare" bin, topped up with the next smallest outcomes until it is large enough.
    """
    ordered = sorted(expected, key=lambda o: expected[o])
    rare: list[Outcome] = []
    mass = 0.0
    while ordered and (expected[ordered[0]] < min_expected or (rare and mass < min_expected)):
        o = ordered.pop(0)
        rare.append(o)
        mass += expected[o]
    bins = [[o] for o in ordered]
    if rare:
        if mass < min_expected and bins:  # everything was rare: merge into the last bin
            bins[-1].extend(rare)
        else:
            bins.append(rare)
    return bins


@dataclass
class FitResult:
    stat: float
    df: int
    p_value: float
    tv: float  # total-variation distance between empirical and exact laws (averaged over prompts)
    outside_support: int  # samples the exact law gives probability 0


def goodness_of_fit(
    samples: Sequence[Counter], exact: Sequence[Mapping[Outcome, float]], min_expected: float = 5.0
) -> FitResult:
    """Pearson's chi-square test of several independent multinomial samples against exact laws.

    ``samples[i]`` counts the outcomes drawn for prompt ``i``; ``exact[i]`` is its law. The
    statistics of the prompts are summed (independent samples), with ``df`` summed too.
    """
    stat, df, tv, outside = 0.0, 0, 0.0, 0
    for counts, law in zip(samples, exact):
        n = sum(counts.values())
        outside += sum(c for o, c in counts.items() if o not in law)
        expected = {o: n * p for o, p in law.items()}
        bins = _bins(expected, min_expected)
        for j, b in enumerate(bins):
            e = sum(expected[o] for o in b)
            obs = sum(counts.get(o, 0) for o in b)
            if j == len(bins) - 1:  # the last (rare, if any) bin also takes outcomes the law forbids
                obs += sum(c for o, c in counts.items() if o not in law)
            stat += (obs - e) ** 2 / e
        df += len(bins) - 1
        keys = set(law) | set(counts)
        tv += 0.5 * sum(abs(counts.get(o, 0) / n - law.get(o, 0.0)) for o in keys)
    return FitResult(stat, df, chi2_sf(stat, df), tv / max(len(samples), 1), outside)


def homogeneity(a: Sequence[Counter], b: Sequence[Counter], exact: Sequence[Mapping[Outcome, float]],
                min_expected: float = 5.0) -> FitResult:
    """Chi-square test that two independent samples (per prompt) come from the same law.

    Bins come from the exact law (so that each expects ``min_expected`` in the smaller
    sample); each bin's pooled frequency is the estimate, so ``df`` is the number of
    non-empty bins minus one, per prompt.
    """
    stat, df, tv = 0.0, 0, 0.0
    for ca, cb, law in zip(a, b, exact):
        if not ca or not cb:
            raise ValueError("both samples need at least one draw per prompt")
        na, nb = sum(ca.values()), sum(cb.values())
        bins = _bins({o: min(na, nb) * p for o, p in law.items()}, min_expected)
        in_law = {o for b_ in bins for o in b_}
        extra = [o for o in set(ca) | set(cb) if o not in in_law]
        if extra:
            bins[-1] = bins[-1] + extra
        for b_ in bins:
            oa = sum(ca.get(o, 0) for o in b_)
            ob = sum(cb.get(o, 0) for o in b_)
            pooled = (oa + ob) / (na + nb)
            if pooled == 0:  # an empty bin carries no information (and no degree of freedom)
                continue
            stat += (oa - na * pooled) ** 2 / (na * pooled) + (ob - nb * pooled) ** 2 / (nb * pooled)
            df += 1
        df -= 1
        keys = set(ca) | set(cb)
        tv += 0.5 * sum(abs(ca.get(o, 0) / na - cb.get(o, 0) / nb) for o in keys)
    return FitResult(stat, df, chi2_sf(stat, df), tv / max(len(a), 1), 0)


def describe(fit: FitResult) -> str:
    return (f"chi2={fit.stat:.1f} df={fit.df} p={fit.p_value:.3g} tv={fit.tv:.4f} "
            f"outside_support={fit.outside_support}")

