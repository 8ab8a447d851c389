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
    python -m benchmarks.data.generated --items 160 --seed 7 --out out/generated-train.jsonl
    python -m benchmarks.data.generated --items 160 --seed 11 --out out/generated-test.jsonl
    for s in sys1bench-train sys1bench-test generated-train generated-test; do
      prefill record out/$s.jsonl --model "$Q" --calibration out/calibration-qwen05.json --facts off \\
        --out out/teacher-qwen05-$s.jsonl; done
    python -m benchmarks.training.readouts --out out/readouts
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from prefill import Prefill
from prefill.engine import choice_confidence as confidence
from prefill.engine import softmax
from prefill.evaluation import metrics
from prefill.evaluation.evaluate import load_jsonl
from prefill.training import fitting
from prefill.training import train as training

HELD_OUT = ("policy_compliance", "guardrail_intent", "upset")
TYPES = ("noul", "choice", "score")


def features(pf: Prefill, paths, teacher_paths, layers, cache: Path) -> list[fitting.Example]:
    if cache.is_file():
        return torch.load(cache, weights_only=False)
    teacher = {}
    for p in teacher_paths:
        teacher.update(training.read_records(p))
    items = [it for p in paths for it in load_jsonl(p)]
    out = fitting.extract(pf.backend, items, layers, teacher)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, cache)
    return out


def scores(examples, probs) -> dict:
    """Accuracy and ECE (top answer's probability) over all questions, and per type accuracy, log loss, ECE."""
    preds = [(p, e.gold) for p, e in zip(probs, examples)]
    out = {
        "n": len(examples),
        "accuracy": round(metrics.accuracy(preds), 4),
        "ece": round(metrics.ece(preds), 4),
        "ece_floor": round(metrics.ece_floor(preds), 4),
    }
    for t in TYPES:
        rows = [(p, e) for p, e in zip(probs, examples) if e.qtype == t]
        if rows:
            s = metrics.summary([(p, e.gold) for p, e in rows], [e.labels for _, e in rows], ordinal=t == "score")
            out[t] = {k: s[k] for k in ("n", "accuracy", "log_loss", "ece")}
    return out


def write_held_out(d: Path) -> None:
    """The held-out families' test items as one file, for `prefill eval --readout` on the served path."""
    lines = [
        line
        for name in ("sys1bench-test.jsonl", "generated-test.jsonl")
        for line in (d / name).read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line).get("family") in HELD_OUT
    ]
    (d / "heldout-families-test.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every readout experiment shares: where the data and results are, the splits, the target mix."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="out")
    ap.add_argument("--out", default="out/readouts")
    ap.add_argument("--label-weight", type=float, default=0.5)
    ap.add_argument(
        "--seeds", default="0,1,2", help="train/validation splits (and training seeds) to repeat the students over"
    )
    return ap


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--early-layers", default="10,15,20")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    d, out = Path(args.data), Path(args.out)
    write_held_out(d)
    pf = Prefill(facts=False)
    depth = pf.backend.model.config.num_hidden_layers
    early_layers = [int(x) for x in args.early_layers.split(",")]
    layers = early_layers + [depth]
    train_all = features(
        pf,
        [d / "sys1bench-train.jsonl", d / "generated-train.jsonl"],
        [d / "teacher-qwen05-sys1bench-train.jsonl", d / "teacher-qwen05-generated-train.jsonl"],
        layers,
        out / "features-train.pt",
    )
    test = features(
        pf,
        [d / "sys1bench-test.jsonl", d / "generated-test.jsonl"],
        [d / "teacher-qwen05-sys1bench-test.jsonl", d / "teacher-qwen05-generated-test.jsonl"],
        layers,
        out / "features-test.pt",
    )
    seen = [e for e in train_all if e.family not in HELD_OUT]

    def split(seed: int):
        fit_ids, val_ids = training.split_items(max(e.item for e in seen) + 1, 0.2, seed)
        return [e for e in seen if e.item in fit_ids], [e for e in seen if e.item in val_ids]

    fit, val = split(seeds[0])
    splits = {
        "held-out families": [e for e in test if e.family in HELD_OUT],
        "training families, new items": [e for e in test if e.family not in HELD_OUT],
    }
    cal = pf.engine.calibration
    last = len(layers) - 1
    rows: dict[str, dict] = defaultdict(dict)
    for name, ex in splits.items():
        rows["training-free (raw)"][name] = scores(ex, [softmax(e.loglik.tolist()) for e in ex])
        rows["training-free (calibrated)"][name] = scores(
            ex, [softmax(cal.adjust(e.qtype, e.loglik.tolist())) for e in ex]
        )
        rows["teacher Qwen2.5-Coder-0.5B (calibrated)"][name] = scores(ex, [e.teacher.tolist() for e in ex])
    heads = {}
    runs: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for seed in seeds:
        fit_s, _ = split(seed)
        for kind in ("linear", "pointer"):
            for rl in (0.0, 1.0):
                label = f"student {kind}, {'CE + RL' if rl else 'CE only'}"
                cfg = fitting.HeadConfig(kind=kind, layer=depth, hidden=fit[0].decision.shape[-1], use_base=True)
                head, log, _ = fitting.fit_head(
                    fit_s, cfg, last, rl_weight=rl, label_weight=args.label_weight, seed=seed
                )
                for name, ex in splits.items():
                    s = scores(ex, fitting.predict(head, ex, last))
                    runs[label][name].append((s["accuracy"], s["ece"]))
                    if seed == seeds[0]:
                        rows[label][name] = s
                if seed == seeds[0]:
                    heads[label] = head
                    rows[label]["training"] = log
    spread = {
        label: {
            name: {
                "accuracy": [a for a, _ in r],
                "ece": [e for _, e in r],
                "accuracy_mean": round(statistics.mean(a for a, _ in r), 4),
                "accuracy_sd": round(statistics.pstdev(a for a, _ in r), 4),
                "ece_mean": round(statistics.mean(e for _, e in r), 4),
                "ece_sd": round(statistics.pstdev(e for _, e in r), 4),
            }
            for name, r in by_split.items()
        }
        for label, by_split in runs.items()
    }
    # early exit: a head per intermediate layer, threshold fitted on the validation items
    final = heads["student linear, CE only"]  # the default of prefill train
    early = {}
    for i, k in enumerate(early_layers):
        cfg = fitting.HeadConfig(kind="linear", layer=k, hidden=fit[0].decision.shape[-1], use_base=False)
        head, _, _ = fitting.fit_head(fit, cfg, i, rl_weight=0.0, label_weight=args.label_weight)
        thr, fit_report = training.exit_threshold(
            fitting.predict(head, val, i), fitting.predict(final, val, last), [e.gold for e in val]
        )
        result = {"threshold": thr, "validation": fit_report}
        for name, ex in splits.items():
            shallow, deep = fitting.predict(head, ex, i), fitting.predict(final, ex, last)
            mixed = [s if confidence(s) >= thr else f for s, f in zip(shallow, deep)]
            f_exit = sum(confidence(s) >= thr for s in shallow) / len(ex)
            result[name] = {
                "exit_fraction": round(f_exit, 3),
                "accuracy_final_only": scores(ex, deep)["accuracy"],
                "accuracy_with_exit": scores(ex, mixed)["accuracy"],
                "shallow_head_alone": scores(ex, shallow)["accuracy"],
                # decoder-layer compute of the question pass saved: exited questions skip
                # layers k+1..L, the rest resume at k (as served); the state runs in full either way
                "compute_saved": round(f_exit * (depth - k) / depth, 3),
            }
        early[f"layer {k} of {depth}"] = result
    # fallback: escalate the student's least sure questions to the teacher
    fallback = {}
    for name, ex in splits.items():
        student = fitting.predict(final, ex, last)
        curve = []
        for thr in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.01):
            mixed = [e.teacher.tolist() if confidence(p) < thr else p for p, e in zip(student, ex)]
            curve.append(
                {
                    "threshold": thr,
                    "escalated": round(sum(confidence(p) < thr for p in student) / len(ex), 3),
                    "accuracy": scores(ex, mixed)["accuracy"],
                }
            )
        fallback[name] = curve
    result = {
        "layers": layers,
        "train_questions": len(fit),
        "validation_questions": len(val),
        "held_out_families": HELD_OUT,
        "rows": rows,
        "seeds": seeds,
        "students_over_seeds": spread,
        "early_exit": early,
        "fallback": fallback,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "readouts.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(table(result))


def table(result: dict) -> str:
    """The tables of docs/measurements/trained-readouts.md, from readouts.json."""
    lines = [
        "| readout | split | accuracy | ECE (floor) | noul acc / ECE | choice acc / ECE | score acc / ECE |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in result["rows"].items():
        for split in ("held-out families", "training families, new items"):
            x = row[split]
            cells = [f"{x[t]['accuracy']:.3f} / {x[t]['ece']:.3f}" if t in x else "" for t in TYPES]
            lines.append(
                f"| {name} | {split} | {x['accuracy']:.3f} | {x['ece']:.3f} ({x['ece_floor']:.3f}) | "
                + " | ".join(cells)
                + " |"
            )
    lines += [
        "",
        f"| student, over splits {result['seeds']} | split | accuracy mean ± sd | ECE mean ± sd |",
        "| --- | --- | --- | --- |",
    ]
    for label, by_split in result["students_over_seeds"].items():
        for split, x in by_split.items():
            lines.append(
                f"| {label} | {split} | {x['accuracy_mean']:.3f} ± {x['accuracy_sd']:.3f} | "
                f"{x['ece_mean']:.3f} ± {x['ece_sd']:.3f} |"
            )
    lines += [
        "",
        "| early-exit head | split | exits | accuracy: final head / with exit | layer compute saved |",
        "| --- | --- | --- | --- | --- |",
    ]
    for layer, r in result["early_exit"].items():
        for split in ("held-out families", "training families, new items"):
            x = r[split]
            lines.append(
                f"| {layer} (threshold {r['threshold']:.3f}) | {split} | {x['exit_fraction']:.1%} | "
                f"{x['accuracy_final_only']:.3f} / {x['accuracy_with_exit']:.3f} | {x['compute_saved']:.1%} |"
            )
    lines += [
        "",
        "| fallback threshold | "
        + " | ".join(str(p["threshold"]) for p in result["fallback"]["held-out families"])
        + " |",
        "| --- " * (len(result["fallback"]["held-out families"]) + 1) + "|",
    ]
    for split, curve in result["fallback"].items():
        lines.append(
            f"| {split}: escalated / accuracy | "
            + " | ".join(f"{p['escalated']:.0%} / {p['accuracy']:.3f}" for p in curve)
            + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
