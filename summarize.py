#!/usr/bin/env python3
"""Evaluate ROUGE and speed on CNN/DailyMail, our engine beside Hugging Face (see docs/summarize.md)."""
from promptlookup.cli.summarize import main
from promptlookup.errors import run_cli

if __name__ == "__main__":
    run_cli(main)
