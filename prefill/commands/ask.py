"""prefill ask: answer questions about one state, JSON out."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from ..settings import Settings
from .common import build_prefill, read_arg

HELP = "answer questions about a state, JSON out"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", required=True, help="the state text, or @FILE (a .json file is read as JSON)")
    p.add_argument("--questions", required=True, help="questions as JSON {id: question}, or @FILE")
    p.add_argument("--usage", action="store_true", help="print the whole response, usage included")
    p.add_argument(
        "--reference-date",
        type=dt.date.fromisoformat,
        default=None,
        help="today, for date questions (YYYY-MM-DD; default: the date the state gives, if any)",
    )


def run(settings: Settings, args) -> int:
    from pydantic import ValidationError

    from ..loading import ModelNotFound
    from ..schema import SystemOneResponse, wire_questions

    try:
        state = read_arg(args.state, as_json=False)
        questions = wire_questions(read_arg(args.questions, as_json=True))
    except (OSError, json.JSONDecodeError, ValidationError) as e:
        print(f"prefill ask: {e}", file=sys.stderr)
        return 2
    try:
        pf = build_prefill(settings, "ask")
        answers, usage = pf.engine.ask(state, questions, args.reference_date)
    except (ModelNotFound, ValueError) as e:  # ValueError: options the model cannot take; RequestTooLarge
        print(f"prefill ask: {e}", file=sys.stderr)
        return 2
    if args.usage:
        dumped = SystemOneResponse(model=pf.name, answers=answers, usage=usage).model_dump(mode="json")
    else:
        dumped = {k: v.model_dump(mode="json") for k, v in answers.items()}
    json.dump(dumped, sys.stdout, ensure_ascii=False, indent=2)
    print()
    return 0
