#!/usr/bin/env bash
# Build an engine from a converted checkpoint; same flags as trtllm-build, plus --backend.
# Runs the real trtllm-build where TensorRT-LLM and a GPU exist, else builds a PyTorch engine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -c 'import sys; from promptlookup.cli.build import main; from promptlookup.errors import run_cli; run_cli(main, sys.argv[1:])' "$@"
