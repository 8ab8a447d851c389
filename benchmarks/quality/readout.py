"""Which readout and prompt format should the engine use? Measured on labelled tasks, same model, one run.

Token readouts: the whole-sequence likelihood of each answer (answer tokens + end-of-answer marker) against the
first-token readout (the next-token distribution restricted to each answer's first token). Formats: the
model's chat template against a plain prompt. Reports accuracy and log loss (NLL of the gold answer after
the softmax over declared answers) per question type.

    python -m benchmarks.quality.readout --per-family 20
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

from benchmarks.data.sys1bench import sys1bench_rows
from prefill import build, loading
from prefill.backends.causal_lm import CausalLMBackend
from prefill.engine import softmax
from prefill.evaluation.evaluate import Item, gold_index, parse_questions
from prefill.render import Branches


def evaluate(backend: CausalLMBackend, items, first_token: bool) -> dict:
    stats: dict[str, list] = defaultdict(list)
    r = backend.renderer
    for item in items:
        ids = list(item.questions)
        branches = [r.question(item.questions[q]) for q in ids]
        if first_token:
            branches = [Branches(b.prompt, tuple(a[:1] for a in b.answers)) for b in branches]
        scores = backend.score(r.state(item.state), branches)
        for qid, loglik in zip(ids, scores):
            q = item.questions[qid]
            p = softmax(loglik)
            g = gold_index(q, item.gold[qid])
            stats[q.type].append((max(range(len(p)), key=p.__getitem__) == g, -math.log(max(p[g], 1e-12))))
    return {
        t: {
            "n": len(v),
            "accuracy": round(sum(a for a, _ in v) / len(v), 3),
            "log_loss": round(sum(nll for _, nll in v) / len(v), 3),
        }
        for t, v in sorted(stats.items())
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--per-family", type=int, default=20)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    source = loading.resolve(args.model)
    model, tokenizer = build.load_causal_lm(source)
    items = [Item(r["state"], parse_questions(r["questions"]), r["gold"]) for r in sys1bench_rows(args.per_family)]
    results = {}
    for chat in (True, False):
        backend = CausalLMBackend(model, tokenizer, source.name, chat=chat)
        for first_token in (False, True):
            name = f"{'chat' if chat else 'plain'} + {'first token' if first_token else 'whole sequence'}"
            t = time.perf_counter()
            results[name] = evaluate(backend, items, first_token)
            print(f"{name:30s} {json.dumps(results[name])}  ({time.perf_counter() - t:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": source.name, "items": len(items), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
