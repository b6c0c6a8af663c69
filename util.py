"""Shared argument parsing for the top-level scripts (TensorRT-LLM's flag names)."""
from promptlookup.cli.args import (  # noqa: F401
    ArgumentParser,
    add_common_args,
    draft_from_args,
    parse_prompt_lookup_config,
    sampling_from_args,
)
