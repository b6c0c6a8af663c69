"""ROUGE scores aggregated the way Hugging Face ``evaluate``'s ``rouge`` metric reports them.

Each (prediction, reference) pair is scored by Google's ``rouge_score`` with
``use_stemmer=True``; the aggregate of a type is the mean F-measure over all pairs,
times 100 (``evaluate`` reports the middle of a bootstrap of that mean, which converges
to the mean; we skip the resampling so scores are exact and deterministic).

``rougeLsum`` is summary-level LCS: texts are split into sentences on ``"\\n"``, exactly as
``evaluate`` passes them through (CNN/DailyMail highlights already have one sentence per
line). A text without newlines is one sentence, so its ``rougeLsum`` equals ``rougeL``.

Cost: O(len(prediction) * len(reference)) per pair for the LCS types.
"""
from __future__ import annotations

from typing import Sequence

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")

_SCORER = None


def _scorer():
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    return _SCORER


def score_pair(prediction: str, reference: str) -> dict[str, float]:
    """F-measures (0..1) of one prediction against its reference, per ROUGE type."""
    scores = _scorer().score(reference, prediction)  # rouge_score takes (target, prediction)
    return {key: scores[key].fmeasure for key in ROUGE_TYPES}


def compute_rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean F-measure x 100 per ROUGE type over aligned ``predictions`` and ``references``."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references):
        for key, value in score_pair(prediction, reference).items():
            totals[key] += value
    return {key: 100.0 * total / len(predictions) for key, total in totals.items()}
