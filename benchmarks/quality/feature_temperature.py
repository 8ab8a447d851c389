"""A temperature that depends on the question, fitted across tasks and checked leave one task out.

The real-task suite's per-type temperatures, fitted on the other tasks, make ECE worse than raw
(`benchmarks.quality.tasks
--report`): one task's answers are too sure, the next one's not sure enough. The real-task issue asks whether a
temperature that depends on what the engine sees of a question would do better: its type, its number of options,
how sure its content-free prior is (the entropy PMI divides out), how sure its own answer is. Here

    T = exp(w · features)

is fitted by log loss on every task but one, and the ECE of the served answers measured on the one left out, for
each set of features, beside the raw ECE and the ECE a perfectly calibrated model would show on as many questions
(`metrics.ece_floor`). Reads a saved run of `benchmarks.quality.tasks` (its raw log-likelihoods and priors); fits only.

    python -m benchmarks.quality.feature_temperature out/tasks-15-bf16-160
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

TYPES = ("noul", "choice", "score")
FEATURES = ("noul", "choice", "score", "log options", "prior entropy", "answer entropy")
VARIANTS = {
    "per type": FEATURES[:3],
    "type + options": FEATURES[:4],
    "type + prior entropy": (*FEATURES[:3], "prior entropy"),
    "type + answer entropy": (*FEATURES[:3], "answer entropy"),
    "all": FEATURES,
}


def entropy_share(p: list[float]) -> float:
    """Entropy over its maximum (log of the number of options): 0 sure, 1 uniform."""
    return -sum(x * math.log(x) for x in p if x > 0) / math.log(len(p))


def question(row: dict, served: dict) -> tuple[list[float], list[float]]:
    """The served scores of one question and its features (`FEATURES`, in order)."""
    from benchmarks.quality.realtext import scores_under
    from prefill.engine import softmax

    scores = scores_under(row, served[row["type"]])
    prior = softmax([w - s for w, s in zip(row["readouts"]["whole"], scores)])  # what the served rule divided out
    features = [float(row["type"] == t) for t in TYPES]
    features += [math.log(len(scores)), entropy_share(prior), entropy_share(softmax(scores))]
    return scores, features


def fit(questions: list[tuple[list[float], list[float], int]], used: tuple[str, ...]) -> list[float]:
    """The weights w of T = exp(w · features) minimising the log loss; features not `used` weigh 0."""
    import torch

    mask = torch.tensor([float(f in used) for f in FEATURES], dtype=torch.float64)
    width = max(len(s) for s, _, _ in questions)
    # padding that takes no probability; not -inf, whose gradient through the division by T would be NaN
    scores = torch.full((len(questions), width), -1e9, dtype=torch.float64)
    for i, (s, _, _) in enumerate(questions):
        scores[i, : len(s)] = torch.tensor(s, dtype=torch.float64)
    features = torch.tensor([f for _, f, _ in questions], dtype=torch.float64)
    gold = torch.tensor([g for _, _, g in questions])
    w = torch.zeros(len(FEATURES), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        t = torch.exp(features @ (w * mask))
        nll = -torch.log_softmax(scores / t[:, None], 1).gather(1, gold[:, None]).mean()
        nll.backward()
        return nll

    opt.step(loss)
    return (w * mask).detach().tolist()


def calibrated(scores: list[float], features: list[float], w: list[float]) -> list[float]:
    from prefill.engine import softmax

    t = math.exp(sum(a * b for a, b in zip(w, features)))
    return softmax([s / t for s in scores])


def leave_one_task_out(rows: list[dict], served: dict) -> dict[str, list[list[float]]]:
    """Per variant, every row's answer calibrated by weights fitted on the other tasks' rows."""
    asked = [(*question(r, served), r["gold"]) for r in rows]
    out = {}
    for name, used in VARIANTS.items():
        probs: list[list[float]] = [[] for _ in rows]
        for task in sorted({r["task"] for r in rows}):
            w = fit([a for a, r in zip(asked, rows) if r["task"] != task], used)
            for i, (a, r) in enumerate(zip(asked, rows)):
                if r["task"] == task:
                    probs[i] = calibrated(a[0], a[1], w)
        out[name] = probs
    return out


def report(out: Path) -> dict:
    from benchmarks.quality.realtext import grouped, mean
    from benchmarks.quality.tasks import load
    from prefill.engine import softmax
    from prefill.evaluation.metrics import ece, ece_floor
    from prefill.scoring import DEFAULT

    meta, rows = load(out)
    served = {t: DEFAULT[t] for t in TYPES}
    print(f"fitting {len(VARIANTS)} variants x {len(meta['tasks'])} held-out tasks ...", file=sys.stderr, flush=True)
    ways = {"raw": [softmax(question(r, served)[0]) for r in rows], **leave_one_task_out(rows, served)}
    print(f"\n## {meta['model']} ({meta['dtype']}), {meta['items']} texts a task: ECE, leave one task out\n")
    print("| task | type | n | " + " | ".join(ways) + " | floor |\n|---|---|---|" + "---|" * (len(ways) + 1))
    table = {}
    for (task, qtype), idx in grouped(list(range(len(rows))), lambda i: (rows[i]["task"], rows[i]["type"])).items():
        gold = [rows[i]["gold"] for i in idx]
        cell = {k: ece([(v[i], g) for i, g in zip(idx, gold)]) for k, v in ways.items()}
        cell["floor"] = ece_floor([(ways["raw"][i], g) for i, g in zip(idx, gold)])
        table[f"{task}|{qtype}"] = cell
        print(f"| {task} | {qtype} | {len(idx)} | " + " | ".join(f"{x:.3f}" for x in cell.values()) + " |")
    keys = [*ways, "floor"]
    print("| mean | | | " + " | ".join(f"{mean(c[k] for c in table.values()):.3f}" for k in keys) + " |")
    print("| at most 0.05 | | | " + " | ".join(f"{sum(c[k] <= 0.05 for c in table.values())}" for k in keys) + " |")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a saved run of benchmarks.quality.tasks (its --out)")
    report(Path(ap.parse_args().run))


if __name__ == "__main__":
    main()
