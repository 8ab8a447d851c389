"""prefill record: answer labelled JSONL and write {request, response} lines, a teacher for prefill train."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..settings import Settings
from .common import build_prefill, labelled_items

HELP = "answer labelled JSONL and write {request, response} lines (a teacher for prefill train)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="labelled JSONL: {state, questions, gold} per line")
    p.add_argument("--out", required=True, help="JSONL of System One requests and responses")


def run(settings: Settings, args) -> int:
    """The same lines any System One server's logs would give: what prefill train reads as a teacher."""
    from tqdm import tqdm

    from ..schema import SystemOneResponse

    items = labelled_items([args.data], "record")
    pf = build_prefill(settings, "record")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for item in tqdm(items, desc="recording", unit="item", file=sys.stderr):
            answers, usage = pf.engine.ask(item.state, item.questions, item.reference_date)
            request = {
                "model": pf.name,
                "state": item.state,
                "questions": {k: q.model_dump(mode="json", exclude_none=True) for k, q in item.questions.items()},
            }
            response = SystemOneResponse(model=pf.name, answers=answers, usage=usage).model_dump(mode="json")
            f.write(json.dumps({"request": request, "response": response}, ensure_ascii=False) + "\n")
    return 0
