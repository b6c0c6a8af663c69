"""Plain, slow reference implementations the drafters are checked against.

``TrtPoolReference`` transcribes TensorRT-LLM's ``NGramPoolManager.get_draft_tokens``
(tensorrt_llm/_torch/speculative/ngram.py, 1.2.0rc3) line by line, with a Python list as
the ordered set of matches: ``list.remove`` while iterating the same list skips the next
element exactly like ``ordered_set.OrderedSet`` (which deletes from its backing list).
"""
from __future__ import annotations


class TrtPoolReference:
    def __init__(self, k: int, n: int, keep_all: bool, oldest: bool, public: bool) -> None:
        self.k, self.n, self.keep_all, self.oldest, self.public = k, n, keep_all, oldest, public
        self.pool: dict = {}
        self.start_index: dict = {}

    def get_draft_tokens(self, prefix: list[int], request_id: int, max_sequence_length: int) -> list[int]:
        prefix_len = len(prefix)
        budget = max_sequence_length - 1 - prefix_len
        if budget <= 0:
            return []
        if request_id not in self.start_index:
            self.start_index[request_id] = 0
            if not self.public:
                self.pool[request_id] = {}
        pool = self.pool if self.public else self.pool[request_id]
        sequence = prefix[self.start_index[request_id]:]
        for size in range(min(self.n, prefix_len - 1), 0, -1):
            for l in range(len(sequence) - size):
                r = min(l + size + self.k, len(sequence))
                pattern = tuple(sequence[l:l + size])
                new_match = tuple(sequence[l + size:r])
                if pattern not in pool or (not self.keep_all and len(new_match) > len(pool[pattern][0])):
                    pool[pattern] = [new_match]
                elif new_match not in pool[pattern]:
                    matches = pool[pattern]
                    for match in matches:
                        if len(match) < len(new_match):
                            matches.remove(match)
                    matches.append(new_match)
        draft: list[int] = []
        for size in range(min(self.n, prefix_len - 1), 0, -1):
            pattern = tuple(prefix[-size:])
            if pattern not in pool:
                continue
            draft = list(pool[pattern][0 if self.oldest else -1])[:budget]
            break
        self.start_index[request_id] = max(0, prefix_len - (self.k + self.n - 1))
        return draft

    def finish(self, request_id: int) -> None:
        if not self.public and request_id in self.pool:
            self.pool.pop(request_id)
            self.start_index.pop(request_id)


def longest_earlier_match(text: list[int], max_len: int) -> tuple[int, int]:
    """(l, e): the longest l <= max_len with text[-l:] also ending at e < len(text) - 1
    (largest such e); (0, -1) if none."""
    n = len(text)
    for length in range(min(max_len, n - 1), 0, -1):
        suffix = text[n - length:]
        for end in range(n - 2, length - 2, -1):
            if text[end - length + 1:end + 1] == suffix:
                return length, end
    return 0, -1


def longest_match_in(corpus: list[int], query: list[int], max_len: int) -> tuple[int, int]:
    """(l, e): the longest suffix of ``query`` (<= max_len) occurring in ``corpus``, most
    recent end e; (0, -1) if none."""
    for length in range(min(max_len, len(query)), 0, -1):
        suffix = query[len(query) - length:]
        for end in range(len(corpus) - 1, length - 2, -1):
            if corpus[end - length + 1:end + 1] == suffix:
                return length, end
    return 0, -1
