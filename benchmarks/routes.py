"""Speed of the two routes on this machine: one request with 1, 21 and 100 yes/no questions about a state of
128, 512 and 2,048 tokens, per model, cold (no state cached), median of --repeats runs.

    python -m benchmarks.routes --out out/routes.json          # ~10 min on 2 cores; run it alone

The decoder route reads the state once and every question as a branch over it; the encoder route reads the
state again in every question's sequence (and cuts it to the encoder's 512 positions: the rows say how
many questions were read with a cut state).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

MODELS = ("all-minilm-l6-v2", "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
FILLER = ("The customer wrote again about the order, the delivery, the invoice and the refund they were promised. "
          "They listed every call they made, who they spoke to and what each person told them. ")


def state_of(renderer, tokens: int) -> str:
    """A text of about `tokens` tokens for this renderer's tokenizer."""
    words = (FILLER * (tokens // 10 + 10)).split()
    lo, hi = 1, len(words)
    while lo < hi:  # the most words whose rendering stays within `tokens`
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if renderer.count(" ".join(words[:mid])) <= tokens else (lo, mid - 1)
    return " ".join(words[:lo])


def questions(n: int) -> dict:
    from prefill.schema import Noul
    return {f"q{i}": Noul(f"Does the text mention topic number {i}?") for i in range(n)}


def time_request(pf, state: str, qs: dict, repeats: int) -> tuple[float, list[str]]:
    seconds, truncated = [], []
    for _ in range(repeats):
        if hasattr(pf.backend, "_states"):
            pf.backend._states.clear()  # cold: the state is read afresh every time
        start = time.perf_counter()
        decision = pf.engine.decide(state, qs)
        seconds.append(time.perf_counter() - start)
        truncated = decision.truncated
    return statistics.median(seconds), truncated


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--questions", default="1,21,100")
    p.add_argument("--state-tokens", default="128,512,2048")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from prefill.api import Prefill
    rows = []
    grid = [(t, n) for t in map(int, args.state_tokens.split(",")) for n in map(int, args.questions.split(","))]
    for model in args.models.split(","):
        pf = Prefill(model, facts=False)
        route = "encoder" if type(pf.backend).__name__ == "EncoderBackend" else "decoder"
        pf.engine.decide(state_of(pf.backend.renderer, 64), questions(2))  # warm-up (and the PMI priors)
        for tokens, n in tqdm(grid, desc=f"{model} ({route})", unit="request", file=sys.stderr):
            state = state_of(pf.backend.renderer, tokens)
            pf.engine.decide(state_of(pf.backend.renderer, 16), questions(n))  # the questions' priors, once
            seconds, truncated = time_request(pf, state, questions(n), args.repeats)
            rows.append({"model": model, "route": route, "state_tokens": tokens, "questions": n,
                         "seconds": round(seconds, 3), "truncated_questions": len(truncated)})
        del pf
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return {"rows": rows}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
