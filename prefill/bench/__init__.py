"""`prefill bench`: speed, measured as ratios in one run (same model, same machine, after warm-up, median
of several runs). Benchmarks are not timed tests: CI runs `prefill bench --quick` on a tiny model to check
that the harness works, and the numbers in docs/measurements/speed.md and cpu-precision.md come from a full run of this
command.

1. The SemIf protocol: 21 yes/no questions on one ~450-token state. prefill (one request) against
   generating all answers as one JSON object with the same weights (greedy `generate`, KV cache on; and
   llama.cpp's own server on the model's GGUF, when `llama-server` is installed: the `bench` extra), one
   pass per question (each re-reading the state), and one HTTP request per question to prefill itself; the
   matrix FLOP/s achieved against a bare bf16 `nn.Linear` timed in the same run, and where the time goes.
   Section `fast` is the same without the per-question baselines (docs/measurements/cpu-precision.md).
2. Scaling: latency and peak memory against questions per request, state length and option count.
3. Overhead: the engine against a bare model forward over the same number of tokens.
4. HTTP: p50/p99 latency and throughput with concurrent clients on loopback (bounded count and time).
5. A plot of latency against questions per request (PNG).

Every timing reads the state afresh (the state cache is emptied before each run), except where a row
says `warm`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["run", "add_arguments", "SECTIONS"]


# ---------------------------------------------------------------- the command


def run(settings: Settings, args: argparse.Namespace) -> dict:
    """The measurements the flags ask for, written to `args.out` (bench.json, the plot). Its imports are here:
    the command line reads this module's flags without loading torch."""
    import torch

    from ..api import Prefill
    from ..loading import resolve
    from ..serving.app import create_app
    from .http import http_load, in_thread
    from .scaling import overhead, plot, scale_options, scale_questions, scale_state
    from .semif import fast_path, semif

    torch.manual_seed(0)
    # The fact pass off: the benchmark measures the model path (it would answer one SemIf question exactly).
    # With --readout, the served path is measured (the trained heads, their early exit, a LoRA merged).
    if len(settings.readouts) > 1:
        raise SystemExit("prefill bench: one --readout at a time")
    # it times decoder passes against generation (the encoder route: benchmarks/speed/routes.py)
    pf = Prefill(settings=settings.replace(facts=False, route="decoder"))
    source = resolve(settings.model, pf.dtype)
    gguf = source.location if source.kind == "gguf" else None  # llama.cpp runs the same file
    quick = args.quick
    repeats = 1 if quick else args.repeats
    n_q = 3 if quick else 21
    sections = set(args.sections.split(","))
    unknown = sections - set(SECTIONS)
    if unknown:
        raise SystemExit(f"prefill bench: unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"model": pf.name, "dtype": pf.dtype, "threads": torch.get_num_threads(), "quick": quick}
    counts = [1, 3] if quick else [int(n) for n in args.question_counts.split(",")]
    steps = {  # section: (report key, measurement), run in this order
        "semif": ("semif", lambda url: semif(pf, repeats, n_q, url, gguf)),
        "fast": ("fast_path", lambda url: fast_path(pf, repeats, n_q, gguf)),
        "overhead": ("overhead", lambda url: overhead(pf, repeats, n_q)),
        "questions": ("scale_questions", lambda url: scale_questions(pf, counts, repeats)),
        "state": ("scale_state", lambda url: scale_state(pf, [64] if quick else [128, 512, 2048, 8000], repeats, n_q)),
        "options": ("scale_options", lambda url: scale_options(pf, [2, 4] if quick else [2, 16, 64, 255], repeats)),
        "http": ("http", lambda url: http_load(url, 2 if quick else 4, 4 if quick else 24, n_q, 30 if quick else 300)),
    }
    chosen = [name for name in SECTIONS if name in sections]
    with in_thread(create_app(pf.engine)) as url:
        for i, name in enumerate(chosen, 1):
            print(f"prefill bench: {name} ({i}/{len(chosen)}) ...", file=sys.stderr, flush=True)
            key, measure = steps[name]
            started = time.perf_counter()
            report[key] = measure(url)
            print(f"prefill bench: {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    if "scale_questions" in report:
        plot(report["scale_questions"], out / "latency_vs_questions.png", pf.name)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report


SECTIONS = ("semif", "fast", "overhead", "questions", "state", "options", "http")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, one repeat")
    p.add_argument("--out", default="bench-out", help="where bench.json and the PNG go")
    p.add_argument(
        "--sections",
        default=",".join(s for s in SECTIONS if s != "fast"),
        help="which measurements to run (comma-separated; fast: the SemIf row without the per-question "
        "baselines, which semif includes)",
    )
    p.add_argument("--question-counts", default="1,5,21,100,1000,5000", help="questions per request to scale over")
