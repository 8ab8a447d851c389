"""The README's table for the CPU fast path, from `prefill bench --sections fast` runs (one run per row).

    B=".venv/bin/prefill bench --sections fast --repeats 5"
    $B --dtype float32 --out out/fast-qwen05-fp32
    $B --dtype auto --out out/fast-qwen05-auto
    $B --model qwen2.5-coder-1.5b-instruct --dtype float32 --out out/fast-qwen15-fp32
    $B --model qwen2.5-coder-1.5b-instruct --dtype auto --out out/fast-qwen15-auto
    python -m benchmarks.fastpath out/fast-qwen05-fp32 out/fast-qwen05-auto out/fast-qwen15-fp32 out/fast-qwen15-auto
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def row(report: dict) -> str:
    s = report.get("fast_path") or report["semif"]
    llama = (f"{s['llamacpp_json_s']:.2f} s: **{s['speedup_vs_llamacpp']:.1f}×**" if "llamacpp_json_s" in s
             else s.get("llamacpp_skipped", "-"))
    where = s.get("where_time_goes_s", {})
    split = " / ".join(f"{where[k]:.2f}" for k in ("state pass", "tree pass", "answer log-probabilities", "rest")
                       if k in where)
    return (f"| {report['model']} | {s['dtype']} | **{s['prefill_s']:.3f} s** | {s['generate_json_s']:.2f} s: "
            f"{s['speedup_vs_generate']:.1f}× | {llama} | {s['one_question_s']:.3f} s: {s['ratio_to_one_question']:.2f} | "
            f"{s['prefill_tokens_run']} tokens, {s['matrix_gflop']:.0f} GFLOP: {s['achieved_gflops']:.0f} GFLOP/s | "
            f"{s['bare_bf16_linear_gflops']:.0f} / {s['bare_fp32_linear_gflops']:.0f} GFLOP/s: "
            f"**{100 * s['share_of_bf16_linear']:.0f} %** | {split} |")


def main(folders: list[str]) -> None:
    print("| model | dtype | 21 questions, one request | HF generate (JSON): prefill faster by | llama.cpp server "
          "(JSON, same GGUF): prefill faster by | 1 question: 21q/1q | matrix work, achieved | bare linear bf16 / fp32 "
          "(this run): engine's share of bf16 | seconds: state / tree / log-probs / rest |")
    print("|---|---|---|---|---|---|---|---|---|")
    for folder in folders:
        print(row(json.loads((Path(folder) / "bench.json").read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
