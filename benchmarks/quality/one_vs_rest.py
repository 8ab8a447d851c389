"""Routing as one yes/no question per destination, against the choice.

A choice shows the model every option at once, and its answer can rest on how they are listed
(benchmarks/quality/option_order.py). One-vs-rest asks instead, for each destination on its own, a yes/no question
about the text, and routes to the destination with the highest P(yes) (served scoring: each question's own
content-free prior divided out). No listing, no order; about as many questions as destinations. This asks the
suite's three routing tasks (benchmarks/quality/tasks.py: ten clinics, six mailing lists, ten archive sections) in
three yes/no forms, beside the suite's two choice phrasings (with a remit per destination, and the names only),
all in one request a text:
- "question": the choice's own question, then 'Is the answer "NAME" (REMIT)?' (what an engine could ask
  for any choice by itself);
- "about, remit": "Is this text about NAME: REMIT?";
- "about, name": "Is this text about NAME?".

    python -m benchmarks.quality.one_vs_rest --model qwen2.5-coder-1.5b-instruct --out out/ovr-15   # ~17 min here
    python -m benchmarks.quality.one_vs_rest --report out/ovr-15
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from benchmarks.quality.suite import TASKS, items, side_main

ROUTING = ("conditions", "lists", "packages")
FORMS = {
    "question": lambda question, name, remit: f'{question} Is the answer "{name}" ({remit})?',
    "about, remit": lambda question, name, remit: f"Is this text about {name}: {remit}?",
    "about, name": lambda question, name, remit: f"Is this text about {name}?",
}


def yes_no_questions(choice: dict) -> dict:
    """{form:index: a Noul} for each destination of a choice with remits, in its criteria's order."""
    from prefill import Noul

    return {
        f"{form}:{i}": Noul(make(choice["instructions"], name, remit))
        for form, make in FORMS.items()
        for i, (name, remit) in enumerate(choice["criteria"].items())
    }


def routed(p_yes: list[float]) -> int:
    return max(range(len(p_yes)), key=p_yes.__getitem__)


def run_task(pf, name: str, n: int, seed: int) -> list[dict]:
    from tqdm import tqdm

    from prefill.evaluation.evaluate import parse_questions

    task = TASKS[name]
    choices = [p for p in task.phrasings if p.question["type"] == "choice"]
    with_remits = choices[0].question
    asked = yes_no_questions(with_remits) | parse_questions({p.qid: p.question for p in choices})
    rows = []
    for text, questions in tqdm(items(task, n, seed), desc=name, unit="text", file=sys.stderr):
        gold = next(a.gold for a in questions if a.qid == choices[0].qid)
        answers = pf.ask(text, asked)
        row = {"task": name, "gold": gold}
        for form in FORMS:
            row[form] = [answers[f"{form}:{i}"].noul for i in range(len(with_remits["criteria"]))]
        for p in choices:  # criteria a dict (with remits) or a list (names only), in the gold's order
            row[p.qid] = [answers[p.qid].probabilities[option] for option in p.question["criteria"]]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> dict:
    """Per task: the accuracy of each yes/no form and each choice phrasing, the top answer against gold."""
    result = {}
    for name in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == name]
        readings = [k for k in mine[0] if k not in ("task", "gold")]
        result[name] = {"n": len(mine)} | {
            k: sum(routed(r[k]) == r["gold"] for r in mine) / len(mine) for k in readings
        }
    return result


def report(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    meta = json.loads((out / "run.json").read_text())
    result = table(rows)
    print(f"\n## {meta['model']} ({meta['dtype']}): routing as one yes/no per destination vs the choice\n")
    print("| task | n | choice, remits | choice, names | yes/no: " + " | yes/no: ".join(FORMS) + " |")
    print("|---|---|---|---|" + "---|" * len(FORMS))
    for name, m in result.items():
        choice = [v for k, v in m.items() if k not in ("n", *FORMS)]
        cells = " | ".join(f"{v:.3f}" for v in [*choice, *(m[f] for f in FORMS)])
        print(f"| {name} | {m['n']} | {cells} |")
    print(
        "\nThe destination each yes/no form routes to most (a catch-all one that every text says yes to shows here):\n"
    )
    print("| task | " + " | ".join(FORMS) + " |\n|---|" + "---|" * len(FORMS))
    for name in result:
        mine = [r for r in rows if r["task"] == name]
        options = list(next(p for p in TASKS[name].phrasings if p.question["type"] == "choice").question["criteria"])
        cells = [most_routed(mine, form, options) for form in FORMS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return result


def most_routed(rows: list[dict], form: str, options: list[str]) -> str:
    counts = Counter(routed(r[form]) for r in rows)
    index, n = counts.most_common(1)[0]
    return f"{options[index]} ({n} of {len(rows)})"


def run(args) -> None:
    from prefill import Prefill

    print(f"loading {args.model or 'the default model'} ({args.dtype}) ...", file=sys.stderr, flush=True)
    pf = Prefill(args.model, dtype=args.dtype, calibration=None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.tasks.split(",")
    n_of = {"conditions": 200, "lists": 96, "packages": 200}
    with open(out / "rows.jsonl", "w", encoding="utf-8") as f:
        for name in names:
            for row in run_task(pf, name, args.items or n_of[name], args.seed):
                f.write(json.dumps(row) + "\n")
    meta = {"model": pf.name, "dtype": pf.dtype, "items": args.items, "seed": args.seed, "tasks": names}
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    report(out)


def main() -> None:
    side_main(__doc__, ROUTING, run, report, type=int, default=None, help="texts a task (default: 200, the lists 96)")


if __name__ == "__main__":
    main()
