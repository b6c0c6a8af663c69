"""Random multi-request scenarios for the pool property tests (V1 and V2 rules)."""
from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def scenarios(draw):
    k = draw(st.integers(1, 6))
    n = draw(st.integers(1, 4))
    keep_all, oldest, public = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    alphabet = draw(st.integers(1, 4))
    token = st.integers(0, alphabet - 1)
    nreq = draw(st.integers(1, 3))
    prompts = draw(st.lists(st.lists(token, max_size=12), min_size=nreq, max_size=nreq))
    limits = draw(st.lists(st.integers(2, 60), min_size=nreq, max_size=nreq))
    # (request, chunk appended after proposing, restart the request afterwards?)
    actions = draw(
        st.lists(st.tuples(st.integers(0, nreq - 1), st.lists(token, max_size=8), st.integers(0, 12)), max_size=40)
    )
    return k, n, keep_all, oldest, public, prompts, limits, actions
