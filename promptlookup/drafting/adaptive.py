"""Adaptive draft length: size each draft from the match behind it and recent acceptance.

Two caps, the draft is cut to the smaller (and never to more than k):

- **Match cap** (as in SuffixDecoding, where a draft may be as long as ``factor * match
  length``): a draft backed by a match of ``m`` tokens may have ``ceil(k * min(m, ref) / ref)``
  tokens, where ``ref`` is the match length that earns a full draft: ``k`` for the
  longest-match mode (so an m-token match drafts m tokens, up to k),
  ``max_matching_ngram_size`` for the pool mode (a hit of the largest n-gram drafts k, a
  1-gram hit k/n), and the cache's n-gram size limit for cache drafts.
- **History cap**, additive increase / multiplicative-style decrease on the feedback from
  :meth:`AdaptiveLength.record`: starts at k; a fully accepted draft raises it by 2 (up to
  k); a draft with a rejected token lowers it to ``max(accepted + 1, cap // 2)``, and always
  by at least one (never below 1). So a run of rejections halves drafts down to one token,
  and full acceptance regrows them.

Invariants: ``1 <= history cap <= k``; :meth:`length` returns a value in ``0..k``, 0 only
for an empty match. Cost O(1).
"""
from __future__ import annotations

GROW_ON_FULL_ACCEPT = 2


class AdaptiveLength:
    __slots__ = ("k", "cap")

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k
        self.cap = k  # history cap

    def match_cap(self, match_len: int, ref: int) -> int:
        if match_len <= 0:
            return 0
        ref = max(1, ref)
        m = min(match_len, ref)
        return min(self.k, -(-self.k * m // ref))

    def length(self, match_len: int, ref: int) -> int:
        """How many tokens a draft backed by a ``match_len``-token match may have."""
        return min(self.cap, self.match_cap(match_len, ref))

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if accepted >= drafted:
            self.cap = min(self.k, self.cap + GROW_ON_FULL_ACCEPT)
        else:
            self.cap = max(1, min(self.cap - 1, max(accepted + 1, self.cap // 2)))
