"""Does the order a choice's options are listed in move its answer, and would reading both orders help?

prefill lists a choice's options sorted by name, whatever order the request gives, so that reordering the
options cannot move an answer (render.py). The order is still one the model reads: listed otherwise, the same
options can get other probabilities. This asks every choice question of the real-task suite
(benchmarks/quality/tasks.py) twice on the same texts, in one process: with the options as served (sorted) and in
the reverse order, each with its own content-free prior (PMI divides out the prior of the order it was asked
in). It reports, per task and phrasing, under the served scoring: the accuracy of each order, how often the
two orders' top answers differ, and the accuracy of both orders read together (the mean of their log
probabilities, renormalised: what an engine reading every choice twice would serve, at twice the question
tokens), and whether the two orders' disagreement tells a wrong answer better than the served confidence
does. Both orders are canonical, so reading both would keep every exactness guarantee.

    python -m benchmarks.quality.option_order --model qwen2.5-coder-1.5b-instruct --out out/order-15   # ~25 min here
    python -m benchmarks.quality.option_order --report out/order-15
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from benchmarks.quality.realtext import grouped, score_items
from benchmarks.quality.suite import TASKS, items, of_types, pool_sizes, side_main, softmax_rows
from benchmarks.quality.tasks import in_format
from prefill.render import Rendered, Renderer, render_question
from prefill.schema import Choice

ORDERS = ("sorted", "reversed")
DEFAULT_TASKS = "language,messages,spam,drugs,uncertainty,fr_reviews,de_reviews,lists,conditions,packages"


def listed_in_reverse(r: Rendered) -> Rendered:
    """The same question with its option lines (between the last "Options:" and the closing instruction)
    in the reverse order; the answers, in the caller's order, unchanged."""
    lines = r.prompt.split("\n")
    first = len(lines) - lines[::-1].index("Options:")
    last = len(lines) - 1
    return Rendered("\n".join(lines[:first] + lines[first:last][::-1] + lines[last:]), r.answers)


class ReversedOptions(Renderer):
    """The served prompt with every choice's options listed in reverse; other question types as served."""

    def question(self, q):
        r = render_question(q, self.noul_words, self.score_words)
        return self.branches(listed_in_reverse(r) if isinstance(q, Choice) else r)


def reversed_like(served: Renderer) -> ReversedOptions:
    return ReversedOptions(
        served.tokenizer,
        chat=served.chat,
        system=served.system,
        noul_words=served.noul_words,
        score_words=served.score_words,
    )


def both_orders(p_sorted: list[float], p_reversed: list[float]) -> list[float]:
    """The two orders' distributions read together: mean log probability, renormalised."""
    logs = [(math.log(a) + math.log(b)) / 2 if a > 0 and b > 0 else -math.inf for a, b in zip(p_sorted, p_reversed)]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    return [w / sum(weights) for w in weights]


def top(p: list[float]) -> int:
    return max(range(len(p)), key=p.__getitem__)


def table(rows: list[dict]) -> dict:
    """Per (task, phrasing): n, accuracy of each order and of both read together, share of top answers
    that differ between the orders; served scoring. Rows carry `order`; a question's two rows share
    (task, qid, item)."""
    from prefill.scoring import DEFAULT

    probs = {}
    for order in ORDERS:
        mine = [r for r in rows if r["order"] == order]
        for r, p in zip(mine, softmax_rows(mine, DEFAULT["choice"])):
            probs[(order, r["task"], r["qid"], r["item"])] = (p, r["gold"])
    result = {}
    for (task, qid), group in grouped(
        [r for r in rows if r["order"] == "sorted"], lambda r: (r["task"], r["qid"])
    ).items():
        right = {"sorted": 0, "reversed": 0, "both": 0}
        served = []  # (confidence, right, the orders agree) of each served answer
        for r in group:
            (a, gold), (b, _) = (probs[(o, task, qid, r["item"])] for o in ORDERS)
            right["sorted"] += top(a) == gold
            right["reversed"] += top(b) == gold
            right["both"] += top(both_orders(a, b)) == gold
            served.append((max(a), top(a) == gold, top(a) == top(b)))
        n = len(group)
        result[f"{task}|{qid}"] = {"n": n} | {k: v / n for k, v in right.items()} | escalation(served)
    return result


def escalation(served: list[tuple[float, bool, bool]]) -> dict:
    """The orders' disagreement as a signal of a wrong answer, against the served confidence: the served
    answers' accuracy where the two orders agree, and over as many of the most confident answers."""
    agree = [ok for _, ok, same in served if same]
    by_confidence = [ok for _, ok, _ in sorted(served, key=lambda s: -s[0])[: len(agree)]]
    return {
        "moved": 1 - len(agree) / len(served),
        "agreeing": sum(agree) / len(agree) if agree else float("nan"),
        "most_confident": sum(by_confidence) / len(by_confidence) if agree else float("nan"),
    }


def report(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    meta = json.loads((out / "run.json").read_text())
    result = table(rows)
    print(f"\n## {meta['model']} ({meta['dtype']}): choice questions, options sorted (served) and reversed\n")
    print(
        "| task | phrasing | n | sorted (served) | reversed | both read together | top answer differs "
        "| served, where the orders agree | served, as many most confident |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for key, m in result.items():
        task, qid = key.split("|")
        accuracies = " | ".join(f"{m[k]:.3f}" for k in ("sorted", "reversed", "both"))
        kept = " | ".join(f"{m[k]:.3f}" for k in ("agreeing", "most_confident"))
        print(f"| {task} | {qid} | {m['n']} | {accuracies} | {m['moved']:.2f} | {kept} |")
    means = {k: sum(m[k] for m in result.values()) / len(result) for k in ("sorted", "reversed", "both", "moved")}
    print(
        f"| mean over phrasings | | | {means['sorted']:.3f} | {means['reversed']:.3f} | {means['both']:.3f} "
        f"| {means['moved']:.2f} | | |"
    )
    return result


def run(args) -> None:
    from prefill import build, loading
    from prefill.precision import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    source = loading.resolve(args.model, dtype)
    print(f"loading {source.name} ({dtype}) ...", file=sys.stderr, flush=True)
    model, tokenizer = build.load_causal_lm(source, dtype)
    backend = in_format(model, tokenizer, source.name, "chat")
    renderers = {"sorted": backend.renderer, "reversed": reversed_like(backend.renderer)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names, n_of = args.tasks.split(","), pool_sizes(args.items)
    with open(out / "scores.jsonl", "w", encoding="utf-8") as f:
        for k, name in enumerate(names, 1):
            asked = of_types(items(TASKS[name], n_of.get(name, n_of.get("*", 48)), args.seed), ["choice"])
            for order in ORDERS:
                backend.renderer = renderers[order]
                for row in score_items(backend, asked, f"[{k}/{len(names)}] {name}, options {order}"):
                    f.write(json.dumps(row | {"order": order}) + "\n")
    backend.renderer = renderers["sorted"]
    meta = {"model": source.name, "dtype": dtype, "items": args.items, "seed": args.seed, "tasks": names}
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    report(out)


def main() -> None:
    side_main(
        __doc__,
        TASKS,
        run,
        report,
        default_tasks=DEFAULT_TASKS,
        default="48,messages=96,lists=96,conditions=200,packages=200",
        help="texts a task: N,TASK=N,...",
    )


if __name__ == "__main__":
    main()
