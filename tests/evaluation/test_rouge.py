"""ROUGE against values worked out by hand (unigram/bigram overlap, LCS, summary-level LCS)."""
from __future__ import annotations

import pytest

from promptlookup.evaluation.rouge import ROUGE_TYPES, compute_rouge, score_pair


def test_single_word_substitution():
    # ref: the cat sat on the mat / pred: the cat lay on the mat (6 tokens each)
    # unigrams in common: the x2, cat, on, mat = 5 -> P = R = F = 5/6
    # bigrams in common: "the cat", "on the", "the mat" = 3 of 5 -> 3/5
    # LCS: the cat on the mat = 5 -> 5/6; one sentence each, so rougeLsum == rougeL
    s = score_pair("the cat lay on the mat", "the cat sat on the mat")
    assert s["rouge1"] == pytest.approx(5 / 6)
    assert s["rouge2"] == pytest.approx(3 / 5)
    assert s["rougeL"] == pytest.approx(5 / 6)
    assert s["rougeLsum"] == pytest.approx(5 / 6)


def test_precision_recall_harmonic_mean():
    # pred "the cat" vs 6-token ref: P = 2/2, R = 2/6 -> F = 2PR/(P+R) = 0.5
    assert score_pair("the cat", "the cat sat on the mat")["rouge1"] == pytest.approx(0.5)


def test_sentence_order_only_matters_for_flat_lcs():
    ref = "alpha beta gamma\ndelta epsilon zeta"
    pred = "delta epsilon zeta\nalpha beta gamma"
    s = score_pair(pred, ref)
    assert s["rouge1"] == pytest.approx(1.0)  # same bag of words
    assert s["rouge2"] == pytest.approx(4 / 5)  # only "gamma delta" / "zeta alpha" differ
    assert s["rougeL"] == pytest.approx(0.5)  # flat LCS is one sentence: 3 of 6
    assert s["rougeLsum"] == pytest.approx(1.0)  # newline-split: each sentence fully matched


def test_stemming_is_on():
    # porter stems: cats -> cat, running -> run, runs -> run
    assert score_pair("cats running", "cat runs")["rouge1"] == pytest.approx(1.0)


def test_aggregate_is_mean_f_times_100():
    preds = ["the cat lay on the mat", "delta epsilon zeta\nalpha beta gamma", ""]
    refs = ["the cat sat on the mat", "alpha beta gamma\ndelta epsilon zeta", "nothing matches"]
    agg = compute_rouge(preds, refs)
    assert set(agg) == set(ROUGE_TYPES)
    assert agg["rouge1"] == pytest.approx(100 * (5 / 6 + 1 + 0) / 3)
    assert agg["rouge2"] == pytest.approx(100 * (3 / 5 + 4 / 5 + 0) / 3)
    assert agg["rougeL"] == pytest.approx(100 * (5 / 6 + 0.5 + 0) / 3)
    assert agg["rougeLsum"] == pytest.approx(100 * (5 / 6 + 1 + 0) / 3)


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError):
        compute_rouge(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        compute_rouge([], [])
