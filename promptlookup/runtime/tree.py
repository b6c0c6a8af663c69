"""The draft tree, as the runtime's callers import it: it lives in :mod:`promptlookup.drafting.tree`.

Kept so that ``from promptlookup.runtime.tree import DraftTree`` keeps working; the tree,
its invariant check and the acceptance rule are defined once, there.
"""
from ..drafting.tree import DraftTree, accept_path, merge_chains

__all__ = ["DraftTree", "accept_path", "merge_chains"]
