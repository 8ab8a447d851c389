"""The LoRA row of the readout experiment (benchmarks/training/readouts.py): same data, same splits, same scoring.

A LoRA on the top layers of the default model plus a linear head (prefill/training/lora.py), distilled from the same
teacher recordings, trained on the same training items of each split (the seen families' 80% item split
of seed s) minus the family left out for choosing the epoch, and scored on the same held-out families and
new items. Run benchmarks/training/readouts.py first (it caches the test features this reuses for the baselines).

    python -m benchmarks.training.lora --out out/readouts                            # lora-top8-r8.json
    python -m benchmarks.training.lora --out out/readouts --top-layers 4 --rank 4   # lora-top4-r4.json
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.training.readouts import HELD_OUT, parser, scores
from prefill import Prefill
from prefill.evaluation.evaluate import load_jsonl
from prefill.training import lora
from prefill.training import train as training


def units(pf: Prefill, paths, teacher_paths, cut: int, cache: Path, keep=lambda item: True) -> list[lora.Unit]:
    """Layer-`cut` inputs of the kept items, numbered as in the full list (as benchmarks/training/readouts.py
    numbers them)."""
    if cache.is_file():
        return torch.load(cache, weights_only=False)
    teacher = {}
    for p in teacher_paths:
        teacher.update(training.read_records(p))
    numbered = [(i, it) for i, it in enumerate(it for p in paths for it in load_jsonl(p)) if keep(it)]
    out = lora.extract(pf.backend, [it for _, it in numbered], cut, teacher)
    for u in out:
        u.item = numbered[u.item][0]
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, cache)
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--top-layers", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    d, out = Path(args.data), Path(args.out)
    pf = Prefill(facts=False)
    cut = pf.backend.depth - args.top_layers
    t0 = time.perf_counter()
    train_units = units(
        pf,
        [d / "sys1bench-train.jsonl", d / "generated-train.jsonl"],
        [d / "teacher-qwen05-sys1bench-train.jsonl", d / "teacher-qwen05-generated-train.jsonl"],
        cut,
        out / f"lora-inputs-train-{cut}.pt",
        keep=lambda it: it.family not in HELD_OUT,
    )
    test_units = units(
        pf,
        [d / "sys1bench-test.jsonl", d / "generated-test.jsonl"],
        [d / "teacher-qwen05-sys1bench-test.jsonl", d / "teacher-qwen05-generated-test.jsonl"],
        cut,
        out / f"lora-inputs-test-{cut}.pt",
    )
    extract_s = time.perf_counter() - t0
    test = torch.load(out / "features-test.pt", weights_only=False)  # readouts.py's: the scoring metadata
    assert [(e.qtype, e.gold) for e in test] == [(t, g) for t, g, _ in lora.labels(test_units)]
    splits = {
        "held-out families": [i for i, e in enumerate(test) if e.family in HELD_OUT],
        "training families, new items": [i for i, e in enumerate(test) if e.family not in HELD_OUT],
    }
    n_seen = max(u.item for u in train_units) + 1
    runs, logs = [], []
    for seed in (int(s) for s in args.seeds.split(",")):
        fit_ids, _ = training.split_items(n_seen, 0.2, seed)  # readouts.py's split of seed s
        fit, validation, held = lora.split_by_family([u for u in train_units if u.item in fit_ids])
        t = time.perf_counter()
        peft_model, head, log = lora.train(
            pf.backend,
            fit,
            validation,
            top_layers=args.top_layers,
            rank=args.rank,
            epochs=args.epochs,
            label_weight=args.label_weight,
            seed=seed,
        )
        log["train_seconds"] = round(time.perf_counter() - t, 1)
        probs = lora.predict(pf.backend, head, test_units)
        peft_model.unload()  # the base model again, for the next split
        result = {name: scores([test[i] for i in idx], [probs[i] for i in idx]) for name, idx in splits.items()}
        runs.append(result)
        logs.append(log | {"validation_family": held})
        print(json.dumps({"seed": seed, "log": logs[-1], "result": result}, indent=2), flush=True)
    summary = {
        name: {"accuracy": [r[name]["accuracy"] for r in runs], "ece": [r[name]["ece"] for r in runs]}
        for name in splits
    }
    for s in summary.values():
        s.update(
            accuracy_mean=round(statistics.mean(s["accuracy"]), 4),
            accuracy_sd=round(statistics.pstdev(s["accuracy"]), 4),
            ece_mean=round(statistics.mean(s["ece"]), 4),
            ece_sd=round(statistics.pstdev(s["ece"]), 4),
        )
    result = {
        "top_layers": args.top_layers,
        "rank": args.rank,
        "epochs": args.epochs,
        "extract_seconds": round(extract_s, 1),
        "seeds": args.seeds,
        "runs": runs,
        "logs": logs,
        "over_seeds": summary,
    }
    (out / f"lora-top{args.top_layers}-r{args.rank}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
