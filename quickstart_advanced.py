#!/usr/bin/env python3
"""TensorRT-LLM's quickstart_advanced.py on the promptlookup LLM API (see README)."""
from promptlookup.cli.quickstart import main
from promptlookup.errors import run_cli

if __name__ == "__main__":
    run_cli(main)
