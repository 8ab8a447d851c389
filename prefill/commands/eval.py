"""prefill eval: accuracy, F1, log loss, Brier, ECE, RPS and a reliability plot on labelled JSONL."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..settings import Settings
from .common import build_prefill, labelled_items

HELP = "evaluate on labelled JSONL: accuracy, F1, log loss, Brier, ECE, RPS, reliability PNG"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="labelled JSONL: {state, questions, gold} per line")
    p.add_argument("--generate", action="store_true", help="also let the model generate each answer and parse it")
    p.add_argument("--folds", type=int, default=5, help="folds for the cross-validated calibration rows")
    p.add_argument(
        "--out", default="eval-out", help="where eval.json and reliability.png (drawn where matplotlib is installed) go"
    )


def run(settings: Settings, args) -> int:
    from ..evaluation import evaluate

    items = labelled_items([args.data], "eval")
    pf = build_prefill(settings, "eval")
    if args.generate and not pf.backend.generates:
        print("prefill eval: --generate needs a model that generates (the decoder route)", file=sys.stderr)
        return 2
    scored = evaluate.score_uncalibrated(pf, items, facts=settings.facts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        **evaluate.evaluation(pf, items, scored, args.folds, args.generate),
        "data": args.data,
        "facts": "on" if settings.facts else "off",
    }
    cal = None if pf.engine.heads else pf.engine.calibration
    evaluate.plot_reliability(scored, out / "reliability.png", f"{pf.name}: {Path(args.data).name}", cal)
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0
