#!/usr/bin/env python3
"""Convert a Hugging Face Llama directory or a GGUF file to a TensorRT-LLM checkpoint.

See ``python convert_checkpoint.py --help`` and docs/checkpoint.md.
"""

if __name__ == "__main__":
    from promptlookup.cli.convert import main
    from promptlookup.errors import run_cli

    run_cli(main)
