"""Model-free drafting for prompt-lookup speculative decoding (see docs/drafting.md).

``make_drafter(DraftConfig(...))`` gives a process-wide :class:`Drafter`; each request gets
a :class:`RequestDrafter` that proposes drafts at O(new tokens) cost per step, flat in the
context length.
"""
from .base import DRAFT_MODES, DraftConfig, Drafter, RequestDrafter
from .cache_file import NgramCache
from .drafter import NgramDrafter, NgramRequest, make_drafter, validate_config
from .identity import TokenizerIdentity
from .simulate import SimStats, config_grid, config_label, simulate, simulate_corpus

__all__ = [
    "DRAFT_MODES",
    "DraftConfig",
    "Drafter",
    "RequestDrafter",
    "NgramCache",
    "NgramDrafter",
    "NgramRequest",
    "TokenizerIdentity",
    "SimStats",
    "config_grid",
    "config_label",
    "make_drafter",
    "simulate",
    "simulate_corpus",
    "validate_config",
]
