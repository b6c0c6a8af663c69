#!/usr/bin/env python3
"""Generate from a built engine with prompt-lookup speculative decoding (see README)."""
from promptlookup.cli.run import main
from promptlookup.errors import run_cli

if __name__ == "__main__":
    run_cli(main)
