#!/usr/bin/env python3
"""OpenAI-compatible server with prompt lookup and continuous batching (see README)."""
from promptlookup.cli.serve import main
from promptlookup.errors import run_cli

if __name__ == "__main__":
    run_cli(main)
