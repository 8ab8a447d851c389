"""The readout experiment: trained heads vs the training-free default model vs the teacher, on held-out data.

Student: the default model (SmolLM2-135M), frozen; its features are computed once, in the served packed
pass, and cached. Teacher: Qwen2.5-Coder-0.5B through prefill with its fitted calibration, recorded with
`prefill record`. Training data: the seed-7 items of the training families; three families (two of
sys1bench's and one generated) are never trained on. Everything is scored on the seed-11 items: the held-out
families (the headline) and the training families (new items).

Rows: training-free (raw and with the shipped calibration), the teacher, and students: linear and pointer
heads, cross-entropy only and cross-entropy + the RLCD term (the ablation). Then early exit (a head at an
intermediate layer; threshold fitted on a validation split of the training items, ≤ 1 point of accuracy lost
there) and the fallback curve (questions under a confidence threshold escalated to the teacher).

    Q=$(scripts/fetch-qwen2.5-0.5b.sh)
    python -m benchmarks.generated --items 160 --seed 7 --out out/generated-train.jsonl
    python -m benchmarks.generated --items 160 --seed 11 --out out/generated-test.jsonl
    for s in sys1bench-train sys1bench-test generated-train generated-test; do
      prefill record out/$s.jsonl --model "$Q" --calibration out/calibration-qwen05.json --facts off \\
        --out out/teacher-qwen05-$s.jsonl; done
    python -m benchmarks.readouts --out out/readouts
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from prefill import Prefill, metrics, training
from prefill.engine import softmax
from prefill.evaluate import load_jsonl

HELD_OUT = ("policy_compliance", "guardrail_intent", "upset")
TYPES = ("noul", "choice", "score")


def features(pf: Prefill, paths, teacher_paths, layers, cache: Path) -> list[training.Example]:
    if cache.is_file():
        return torch.load(cache, weights_only=False)
    teacher = {}
    for p in teacher_paths:
        teacher.update(training.read_records(p))
    items = [it for p in paths for it in load_jsonl(p)]
    out = training.extract(pf.backend, items, layers, teacher)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, cache)
    return out


def scores(examples, probs) -> dict:
    """Accuracy over all questions, and per type accuracy, log loss and ECE."""
    out = {"n": len(examples), "accuracy": round(sum(metrics.argmax(p) == e.gold for p, e in zip(probs, examples)) / len(examples), 4)}
    for t in TYPES:
        rows = [(p, e) for p, e in zip(probs, examples) if e.qtype == t]
        if rows:
            s = metrics.summary([(p, e.gold) for p, e in rows], [e.labels for _, e in rows], ordinal=t == "score")
            out[t] = {k: s[k] for k in ("n", "accuracy", "log_loss", "ece")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="out")
    ap.add_argument("--out", default="out/readouts")
    ap.add_argument("--early-layers", default="10,15,20")
    ap.add_argument("--label-weight", type=float, default=0.5)
    args = ap.parse_args()
    d, out = Path(args.data), Path(args.out)
    pf = Prefill(facts=False)
    depth = pf.backend.model.config.num_hidden_layers
    early_layers = [int(x) for x in args.early_layers.split(",")]
    layers = early_layers + [depth]
    train_all = features(pf, [d / "sys1bench-train.jsonl", d / "generated-train.jsonl"],
                         [d / "teacher-qwen05-sys1bench-train.jsonl", d / "teacher-qwen05-generated-train.jsonl"],
                         layers, out / "features-train.pt")
    test = features(pf, [d / "sys1bench-test.jsonl", d / "generated-test.jsonl"],
                    [d / "teacher-qwen05-sys1bench-test.jsonl", d / "teacher-qwen05-generated-test.jsonl"],
                    layers, out / "features-test.pt")
    seen = [e for e in train_all if e.family not in HELD_OUT]
    fit_ids, val_ids = training.split_items(max(e.item for e in seen) + 1, 0.2)
    fit = [e for e in seen if e.item in fit_ids]
    val = [e for e in seen if e.item in val_ids]
    splits = {"held-out families": [e for e in test if e.family in HELD_OUT],
              "training families, new items": [e for e in test if e.family not in HELD_OUT]}
    cal = pf.engine.calibration
    last = len(layers) - 1
    rows: dict[str, dict] = defaultdict(dict)
    for name, ex in splits.items():
        rows["training-free (raw)"][name] = scores(ex, [softmax(e.loglik.tolist()) for e in ex])
        rows["training-free (calibrated)"][name] = scores(ex, [softmax(cal.adjust(e.qtype, e.loglik.tolist())) for e in ex])
        rows["teacher Qwen2.5-Coder-0.5B (calibrated)"][name] = scores(ex, [e.teacher.tolist() for e in ex])
    heads = {}
    for kind in ("linear", "pointer"):
        for rl in (0.0, 1.0):
            label = f"student {kind}, {'CE + RL' if rl else 'CE only'}"
            cfg = training.ReadoutConfig(kind=kind, layer=depth, hidden=fit[0].decision.shape[-1], use_base=True)
            head, log = training.train_head(fit, cfg, last, rl_weight=rl, label_weight=args.label_weight, validation=val)
            heads[label] = head
            for name, ex in splits.items():
                rows[label][name] = scores(ex, training.predict(head, ex, last))
            rows[label]["training"] = log
    # early exit: a head per intermediate layer, threshold fitted on the validation items
    final = heads["student linear, CE only"]
    early = {}
    for i, k in enumerate(early_layers):
        cfg = training.ReadoutConfig(kind="linear", layer=k, hidden=fit[0].decision.shape[-1], use_base=False)
        head, _ = training.train_head(fit, cfg, i, label_weight=args.label_weight, validation=val)
        thr, fit_report = training.exit_threshold(training.predict(head, val, i), training.predict(final, val, last),
                                                  [e.gold for e in val])
        result = {"threshold": thr, "validation": fit_report}
        for name, ex in splits.items():
            shallow, deep = training.predict(head, ex, i), training.predict(final, ex, last)
            mixed = [s if max(s) >= thr else f for s, f in zip(shallow, deep)]
            f_exit = sum(max(s) >= thr for s in shallow) / len(ex)
            result[name] = {"exit_fraction": round(f_exit, 3),
                            "accuracy_final_only": scores(ex, deep)["accuracy"],
                            "accuracy_with_exit": scores(ex, mixed)["accuracy"],
                            "shallow_head_alone": scores(ex, shallow)["accuracy"],
                            # decoder-layer compute of the question pass saved: exited questions skip
                            # layers k+1..L, the rest resume at k (as served); the state runs in full either way
                            "compute_saved": round(f_exit * (depth - k) / depth, 3)}
        early[f"layer {k} of {depth}"] = result
    # fallback: escalate the student's least sure questions to the teacher
    fallback = {}
    for name, ex in splits.items():
        student = training.predict(final, ex, last)
        curve = []
        for thr in (0.0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01):
            mixed = [e.teacher.tolist() if max(p) < thr else p for p, e in zip(student, ex)]
            curve.append({"threshold": thr, "escalated": round(sum(max(p) < thr for p in student) / len(ex), 3),
                          "accuracy": scores(ex, mixed)["accuracy"]})
        fallback[name] = curve
    result = {"layers": layers, "train_questions": len(fit), "validation_questions": len(val),
              "held_out_families": HELD_OUT, "rows": rows, "early_exit": early, "fallback": fallback}
    out.mkdir(parents=True, exist_ok=True)
    (out / "readouts.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
