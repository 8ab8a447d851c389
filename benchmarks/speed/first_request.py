"""A process's first request, with and without `Prefill.warm_up` (what `prefill serve` runs before it says
it is ready).

The first request a fresh process answers pays one-time costs the later ones do not: the matrix library
builds its kernels for the shapes it meets, memory is touched for the first time, the content-free state the
priors are read on is run. A newcomer who starts `prefill serve` and sends one curl meets exactly that
request. Each round starts two fresh processes, one that warms up and one that does not (in alternating
order, so a drift in the machine's speed falls on both), and times three of the newcomer's requests
(benchmarks/quality/newcomer.py's messages with their questions), chosen so that no question is asked twice: each
request pays its questions' priors, the first one its process's one-time costs too:

    python -m benchmarks.speed.first_request --model qwen2.5-coder-1.5b-instruct    # about 2 minutes here
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.quality.newcomer import ASKED, CASES

REQUESTS = 3


def first_asks(n: int = REQUESTS) -> list[tuple[str, dict]]:
    """The first `n` newcomer messages whose questions were not asked by the ones before."""
    chosen, asked = [], set()
    for text, expected in CASES:
        if len(chosen) < n and not asked & expected.keys():
            chosen.append((text, {q: ASKED[q] for q in expected}))
            asked |= expected.keys()
    return chosen


def child(model: str | None, dtype: str, warm: bool) -> dict:
    """In a fresh process: load, warm up or not, then time the first requests."""
    from prefill import Prefill

    started = time.perf_counter()
    pf = Prefill(model, dtype=dtype)
    loaded = time.perf_counter() - started
    warming = pf.warm_up() if warm else 0.0
    seconds = []
    for text, questions in first_asks():
        t = time.perf_counter()
        pf.ask(text, questions)
        seconds.append(time.perf_counter() - t)
    return {"load_s": loaded, "warm_up_s": warming, "requests_s": seconds}


def run(model: str | None, dtype: str, rounds: int) -> dict[str, list[dict]]:
    from tqdm import tqdm

    runs: dict[str, list[dict]] = {"without warm-up": [], "with warm-up": []}
    order = [mode for r in range(rounds) for mode in (list(runs) if r % 2 == 0 else list(runs)[::-1])]
    for mode in tqdm(order, desc="fresh processes", unit="process", file=sys.stderr):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.speed.first_request",
            "--child",
            "warm" if mode == "with warm-up" else "cold",
        ]
        cmd += ["--dtype", dtype] + (["--model", model] if model else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    return runs


def table(runs: dict[str, list[dict]]) -> str:
    """Medians over the rounds."""
    lines = [
        "| process | load | warm-up | 1st request | 2nd | 3rd |",
        "|---|---|---|---|---|---|",
    ]
    for mode, done in runs.items():
        med = [statistics.median(r["requests_s"][i] for r in done) for i in range(REQUESTS)]
        load = statistics.median(r["load_s"] for r in done)
        warming = statistics.median(r["warm_up_s"] for r in done)
        cell = f"{warming:.2f} s" if mode == "with warm-up" else "-"
        lines.append(f"| {mode} | {load:.1f} s | {cell} | " + " | ".join(f"{s:.2f} s" for s in med) + " |")
    return "\n".join(lines) + f"\n\nmedians over {len(next(iter(runs.values())))} fresh processes each"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="as prefill's --model (default: the embedded model)")
    ap.add_argument("--dtype", default="auto", help="as prefill's --dtype")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes of each kind (default %(default)s)")
    ap.add_argument("--child", choices=["warm", "cold"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.dtype, args.child == "warm")))
        return
    print(
        f"first_request: {args.rounds} rounds of two fresh processes, {args.model or 'the default model'}",
        file=sys.stderr,
    )
    print(table(run(args.model, args.dtype, args.rounds)))


if __name__ == "__main__":
    main()
