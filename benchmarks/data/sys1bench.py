"""Labelled tasks that install offline: sys1bench's policy-labelled generators, written as prefill's
labelled JSONL ({state, questions, gold, family} per line), for `prefill eval` and `prefill calibrate`.

    python -m benchmarks.data.sys1bench --per-family 40 --seed 7 --out data/sys1bench-train.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GENERATORS = ("support_tickets", "phishing_email", "log_triage", "policy_compliance", "guardrail_intent")


def sys1bench_rows(n_per_family: int, seed: int = 7, families: tuple[str, ...] = GENERATORS) -> list[dict]:
    from sys1bench.generators import get_generator

    rows = []
    for family in families:
        for task in get_generator(family, n=n_per_family, seed=seed).generate():
            questions, gold = {}, {}
            for qid, q in task.questions.items():
                if q.ground_truth is None:
                    continue
                if q.type == "noul":
                    questions[qid] = {"type": "noul", "instructions": q.instructions}
                    gold[qid] = bool(q.ground_truth)
                elif q.type == "choice":
                    keys = [c.key for c in q.criteria]
                    if q.ground_truth not in keys:  # "none of the above" items: not a declared option
                        continue
                    questions[qid] = {
                        "type": "choice",
                        "instructions": q.instructions,
                        "criteria": {c.key: c.description or None for c in q.criteria},
                    }
                    gold[qid] = q.ground_truth
                else:
                    levels = [c.level for c in q.criteria]
                    questions[qid] = {
                        "type": "score",
                        "instructions": q.instructions,
                        "criteria": [c.description or str(c.level) for c in q.criteria],
                    }
                    gold[qid] = levels.index(q.ground_truth)
            if questions:
                rows.append({"family": family, "state": task.state, "questions": questions, "gold": gold})
    return rows


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    """Labelled rows as JSONL, one item a line; says how many items and questions went where."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} items, {sum(len(r['questions']) for r in rows)} questions -> {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--families", default=",".join(GENERATORS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    write_jsonl(sys1bench_rows(args.per_family, args.seed, tuple(args.families.split(","))), args.out)


if __name__ == "__main__":
    main()
