"""Plain, slow reference implementations the drafters are checked against.

``TrtPoolReference`` restates, as directly and slowly as possible, the pool rules listed
in the module docstring of :mod:`promptlookup.drafting.pool` (TensorRT-LLM's n-gram pool
semantics): every call re-inserts the whole window, and the removal pass keeps the
documented quirk (an entry that slides into the slot of a removed one is not examined).
"""
from __future__ import annotations


class TrtPoolReference:
    def __init__(self, k: int, n: int, keep_all: bool, oldest: bool, public: bool) -> None:
        self.k, self.n, self.keep_all, self.oldest, self.public = k, n, keep_all, oldest, public
        self.tables: dict = {}  # owner (None when public, else the request) -> {pattern: [matches]}
        self.window_start: dict = {}  # request -> where its next update window begins

    def _insert(self, table: dict, pattern: tuple, match: tuple) -> None:
        current = table.get(pattern)
        if current is None or (not self.keep_all and len(match) > len(current[0])):
            table[pattern] = [match]
            return
        if match in current:
            return
        survivors, skip_next = [], False
        for entry in current:
            if skip_next:  # slid into a removed entry's slot: not looked at in this pass
                survivors.append(entry)
                skip_next = False
            elif len(entry) < len(match):
                skip_next = True  # removed
            else:
                survivors.append(entry)
        table[pattern] = survivors + [match]

    def get_draft_tokens(self, prefix: list[int], request_id: int, max_sequence_length: int) -> list[int]:
        length = len(prefix)
        room = max_sequence_length - 1 - length
        if room <= 0:
            return []
        start = self.window_start.setdefault(request_id, 0)
        table = self.tables.setdefault(None if self.public else request_id, {})
        window = prefix[start:]
        sizes = range(min(self.n, length - 1), 0, -1)
        for size in sizes:
            for p in range(len(window) - size):
                self._insert(table, tuple(window[p:p + size]), tuple(window[p + size:p + size + self.k]))
        self.window_start[request_id] = max(0, length - (self.k + self.n - 1))
        for size in sizes:
            matches = table.get(tuple(prefix[length - size:]))
            if matches:
                return list(matches[0] if self.oldest else matches[-1])[:room]
        return []

    def finish(self, request_id: int) -> None:
        if not self.public:
            self.tables.pop(request_id, None)
            self.window_start.pop(request_id, None)


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
