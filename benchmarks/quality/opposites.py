"""Which opposite to write for a yes/no question: each candidate asked as served, `x_opposite` on the question,
on the real-task suite's texts (benchmarks/quality/tasks.py), against the question alone and the opposite alone.

An opposite helps only where the model reads it the right way round
(docs/measurements/real-tasks.md#a-yesno-question-with-its-opposite); the suite's own opposites for spam and hedged
sentences carry a "not" or a "without", which the 1.5B reads backwards. This asks whether a plainly worded opposite
does better there, with the suite's review pair as the case where pairing is known to help.

    python -m benchmarks.quality.opposites --model qwen2.5-coder-1.5b-instruct --out out/opposites-15  # ~8 min
    python -m benchmarks.quality.opposites --report out/opposites-15
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.quality.suite import TASKS, items, side_main, task_metrics

SPAM = (
    "Is this email spam?",
    (
        "Is this a legitimate email?",
        "Is this a genuine personal or work email?",
        "Is this a legitimate email, not spam?",
    ),
)
REVIEWS = ("Is this review positive?", ("Is this review negative?",))
# task -> (the suite's yes/no question, candidate opposites); for spam and hedged sentences the last is the suite's
# own opposite.
CANDIDATES = {
    "de_reviews": REVIEWS,
    "fr_reviews": REVIEWS,
    "spam": SPAM,
    "emails": SPAM,
    "messages": (
        "Is this message written in English?",
        ("Is this message written in a language other than English?", "Is this message written in French or German?"),
    ),
    "uncertainty": (
        "Does this sentence express uncertainty or speculation?",
        (
            "Is this sentence stated as a plain fact?",
            "Is this sentence stated with certainty?",
            "Is this sentence stated as a plain fact, without hedging?",
        ),
    ),
}


def questions(question: str, opposites: tuple[str, ...]) -> dict:
    """The question alone, each opposite alone, and the question with each opposite (`x_opposite`): one
    request a text, so every reading comes from the same pass."""
    from prefill import Noul

    asked = {"alone": Noul(question)}
    for i, o in enumerate(opposites):
        asked[f"opposite {i}"] = Noul(o)
        asked[f"paired {i}"] = Noul(question, x_opposite=o)
    return asked


def run_task(pf, name: str, n: int, seed: int) -> dict:
    """Each text's gold answer to the question (True: yes) and P(yes) of every reading."""
    from tqdm import tqdm

    task, (question, opposites) = TASKS[name], CANDIDATES[name]
    phrasing = next(p for p in task.phrasings if p.question.get("instructions") == question)
    asked, rows = questions(question, opposites), []
    for text, gold in tqdm(items(task, n, seed), desc=name, unit="text", file=sys.stderr):
        yes = next(a.gold for a in gold if a.qid == phrasing.qid) == 0
        rows.append({"yes": yes, "p": {k: a.noul for k, a in pf.ask(text, asked).items()}})
    return {"question": question, "opposites": list(opposites), "rows": rows}


def accuracy_auc(rows: list[dict], key: str, flip: bool = False) -> str:
    """The suite's accuracy and AUC (`task_metrics`) of one reading, as P(yes) for the question."""
    ps = [1 - r["p"][key] if flip else r["p"][key] for r in rows]
    m = task_metrics([{"gold": 0 if r["yes"] else 1, "type": "noul"} for r in rows], [[p, 1 - p] for p in ps])
    return f"{m['accuracy']:.2f} / {m['auc']:.2f}"


def table(results: dict) -> str:
    lines = [
        "accuracy / AUC for the question (an opposite's P(yes) read as P(no) for it)",
        "",
        "| task | question alone | opposite | the opposite alone | paired (`x_opposite`) |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        for i, o in enumerate(r["opposites"]):
            alone = f'"{r["question"]}" {accuracy_auc(r["rows"], "alone")}' if i == 0 else ""
            flipped, paired = accuracy_auc(r["rows"], f"opposite {i}", True), accuracy_auc(r["rows"], f"paired {i}")
            lines.append(f'| {name if i == 0 else ""} | {alone} | "{o}" | {flipped} | {paired} |')
    return "\n".join(lines)


def run(args) -> None:
    """Every task asked in turn, results.json rewritten after each, then the table."""
    from prefill import Prefill

    names = [t for t in args.tasks.split(",") if t]
    print(f"opposites: loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    pf = Prefill(args.model, dtype=args.dtype)
    results, out = {}, Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names, 1):
        print(f"opposites: task {k} of {len(names)}: {name}, {args.items} texts", file=sys.stderr, flush=True)
        results[name] = run_task(pf, name, args.items, args.seed)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


def report(path: Path) -> None:
    print(table(json.loads((path / "results.json").read_text())))


def main() -> None:
    side_main(__doc__, CANDIDATES, run, report, type=int, default=48, help="texts a task, as many of each label")


if __name__ == "__main__":
    main()
