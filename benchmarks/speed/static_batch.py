"""`prefill batch` with a static student alone (`--readout STUDENT --student-below 0`: no model, no torch), on 2
cores: rows a second over a task's texts repeated to `--rows`, the process's start and output included. The head
is untrained (random weights of the right shape: the speed does not depend on them), so no teacher is needed;
`--against DIR` times another checkout of prefill (e.g. `git worktree add /tmp/old 0fffd24`) on the same files,
alternated round by round.

    python -m benchmarks.speed.static_batch --tasks packages,emails --rows 100000 --rounds 2 --against /tmp/old
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.training.distill_tasks import write_task
from benchmarks.training.static_student import batch_seconds


def untrained_student(questions_file: Path, out: Path) -> None:
    from prefill.batch import load_questions
    from prefill.schema import answer_labels
    from prefill.static_features import HASH_BUCKETS
    from prefill.training import static as training

    table, tokenizer = training.table(training.DEFAULT_ENCODER)
    rng = np.random.default_rng(0)
    heads = []
    for q in load_questions(json.loads(questions_file.read_text())).values():
        n = len(answer_labels(q))
        weights = (0.1 * rng.standard_normal((n, table.shape[1] + HASH_BUCKETS))).astype(np.float32)
        heads.append({"question": q, "weights": weights, "bias": np.zeros(n, np.float32), "temperature": 1.0,
                      "penalty": 0.0, "out_of_fold_agreement": 0.0})  # fmt: skip
    training.save(out, "untrained", table, tokenizer, heads)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="packages,emails")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--against", default=None, help="another prefill checkout, timed on the same files")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parents[2]
    codes = {"this checkout": here} | ({f"--against {args.against}": Path(args.against)} if args.against else {})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rates: dict[tuple[str, str], list[float]] = {}
        for task in args.tasks.split(","):
            data, questions = write_task(task, 400, 0, work / task)
            rows = data.read_text(encoding="utf-8").splitlines()
            chars = statistics.mean(len(json.loads(r)["text"]) for r in rows)
            big = work / task / "big.jsonl"
            big.write_text("\n".join((rows * (args.rows // len(rows) + 1))[: args.rows]) + "\n", encoding="utf-8")
            untrained_student(questions, work / task / "student")
            for r in range(1, args.rounds + 1):
                for label, code in codes.items():
                    seconds = batch_seconds(big, questions, work / task / "student", work / task / "out.jsonl", code)
                    rate = args.rows / seconds
                    rates.setdefault((task, label), []).append(rate)
                    print(f"[{task} {r}/{args.rounds}] {label}: {rate:.0f} rows/s over {args.rows:,} rows "
                          f"(texts of {chars:.0f} characters on average)", file=sys.stderr, flush=True)  # fmt: skip
    print("| task | code | rows a second (each round) |\n|---|---|---|")
    for (task, label), found in rates.items():
        print(f"| {task} | {label} | {' / '.join(f'{x:.0f}' for x in found)} |")


if __name__ == "__main__":
    main()
