"""prefill calibrate: temperatures per question type fitted on labelled JSONL, saved tied to the model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..settings import Settings
from .common import build_prefill, labelled_items

HELP = "fit temperatures per question type (or per question) on labelled JSONL, saved tied to the model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="labelled JSONL: {state, questions, gold} per line")
    p.add_argument(
        "--buckets", action="store_true", help="also fit per option-count bucket (kept only if it helps held-out)"
    )
    p.add_argument(
        "--per-question",
        action="store_true",
        help="also fit a temperature and a bias per answer for each question asked in 20+ rows, found again by "
        "its wording and answers (kept only if it helps held-out)",
    )
    p.add_argument("--folds", type=int, default=5)
    p.add_argument(
        "--out", default=None, help="the calibration file (default: the cache, where serve and the API find it)"
    )


def run(settings: Settings, args) -> int:
    from ..calibration import setup
    from ..evaluation import evaluate
    from ..loading import cache_dir

    items = labelled_items([args.data], "calibrate")
    pf = build_prefill(settings, "calibrate")
    scored = evaluate.score_uncalibrated(
        pf, items, facts=False
    )  # temperatures are the model's; exact answers need none
    cal, result = evaluate.calibrate(pf, items, scored, args.folds, args.buckets, args.per_question)
    cal.setup = setup(pf.backend.renderer, pf.engine.scoring)
    cal.notes["data"] = Path(args.data).name
    path = Path(args.out) if args.out else cache_dir() / "calibration" / f"{pf.backend.fingerprint[:16]}.json"
    cal.save(path)
    result["temperatures"] = cal.parameters()
    result["saved"] = str(path)
    print(json.dumps(result, indent=2))
    return 0
