"""`prefill serve` and `prefill ask`."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from .engine import DEFAULT_MAX_REQUEST_TOKENS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefill", description="Typed decisions from a language model in one prefill pass.")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default=None,
                       help="a Hugging Face model id, a local model directory or a .gguf file (default: the embedded SmolLM2-135M-Instruct)")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        p.add_argument("--packing", default="auto", choices=["auto", "packed", "rows"],
                       help="packed: one tree-masked pass; rows: a row per answer over the cached state (for models that ignore masks)")
        p.add_argument("--no-chat", action="store_true", help="use a plain prompt instead of the model's chat template")
        p.add_argument("--max-request-tokens", type=int, default=DEFAULT_MAX_REQUEST_TOKENS)
        p.add_argument("--calibration", default="auto",
                       help="auto (the temperatures fitted for this model, if any), a calibration file, or none")
        p.add_argument("--facts", default="on", choices=["on", "off"],
                       help="answer single numeric and date comparisons exactly, by parsing (default on)")

    serve = sub.add_parser("serve", help="serve the TypeSafe System One API")
    model_options(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", action="append", default=[],
                       help="require this Bearer key (repeatable; also PREFILL_API_KEYS, comma-separated)")
    serve.add_argument("--log-level", default="info")

    ask = sub.add_parser("ask", help="answer questions about a state, JSON out")
    model_options(ask)
    ask.add_argument("--state", required=True, help="the state text, or @FILE (a .json file is read as JSON)")
    ask.add_argument("--questions", required=True, help="questions as JSON {id: question}, or @FILE")
    ask.add_argument("--usage", action="store_true", help="print the whole response, usage included")
    ask.add_argument("--reference-date", type=dt.date.fromisoformat, default=None,
                     help="today, for date questions (YYYY-MM-DD; default: the date the state gives, if any)")

    ev = sub.add_parser("eval", help="evaluate on labelled JSONL: accuracy, F1, log loss, Brier, ECE, RPS, reliability PNG")
    model_options(ev)
    ev.add_argument("data", help="labelled JSONL: {state, questions, gold} per line")
    ev.add_argument("--generate", action="store_true", help="also let the model generate each answer and parse it")
    ev.add_argument("--folds", type=int, default=5, help="folds for the cross-validated calibration rows")
    ev.add_argument("--out", default="eval-out", help="where eval.json and reliability.png go")

    cal = sub.add_parser("calibrate", help="fit temperatures per question type on labelled JSONL, saved tied to the model")
    model_options(cal)
    cal.add_argument("data", help="labelled JSONL: {state, questions, gold} per line")
    cal.add_argument("--buckets", action="store_true", help="also fit per option-count bucket (kept only if it helps held-out)")
    cal.add_argument("--folds", type=int, default=5)
    cal.add_argument("--out", default=None, help="the calibration file (default: the cache, where serve and the API find it)")

    bench = sub.add_parser("bench", help="measure speed against generation and per-question passes (see prefill/bench.py)")
    model_options(bench)
    from .bench import add_arguments
    add_arguments(bench)

    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "bench":
        from .bench import run
        print(json.dumps(run(args), indent=2))
        return 0
    return _ask(args)


def _prefill(args):
    from .api import Prefill
    return Prefill(args.model, dtype=args.dtype, chat=False if args.no_chat else None, packing=args.packing,
                   max_request_tokens=args.max_request_tokens,
                   calibration=None if args.calibration == "none" else args.calibration,
                   facts=args.facts == "on")


def _scored(args, facts: bool):
    from . import evaluate
    from .engine import Engine
    items = evaluate.load_jsonl(args.data)
    pf = _prefill(args)
    raw = Engine(pf.backend, max_request_tokens=pf.engine.max_request_tokens, use_facts=facts)  # uncalibrated
    return pf, items, evaluate.predict(raw, items)


def _eval(args) -> int:
    from . import evaluate
    pf, items, scored = _scored(args, facts=args.facts == "on")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": pf.name, "fingerprint": pf.backend.fingerprint, "data": args.data, "items": len(items),
              "facts": args.facts, "raw": evaluate.report(scored)}
    cal = pf.engine.calibration
    if cal is not None:
        result["calibrated"] = evaluate.report(scored, cal)
        result["temperatures"] = cal.parameters()
    result["calibrated_cross_validated"] = evaluate.cross_validate(pf.name, pf.backend.fingerprint, scored, args.folds)
    if args.generate:
        result["generate_and_parse"] = evaluate.generate_baseline(pf.engine, items)
    evaluate.plot_reliability(scored, out / "reliability.png", f"{pf.name}: {Path(args.data).name}", cal)
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


def _calibrate(args) -> int:
    from . import evaluate
    from .loading import cache_dir
    pf, items, scored = _scored(args, facts=False)  # temperatures are the model's; exact answers need none
    fp = pf.backend.fingerprint
    before = evaluate.report(scored)
    per_type = evaluate.cross_validate(pf.name, fp, scored, args.folds)
    result = {"model": pf.name, "items": len(items), "raw": before, "held_out_per_type": per_type}
    buckets = False
    if args.buckets:
        per_bucket = evaluate.cross_validate(pf.name, fp, scored, args.folds, buckets=True)
        result["held_out_per_bucket"] = per_bucket
        buckets = sum(v["log_loss"] for v in per_bucket.values()) < sum(v["log_loss"] for v in per_type.values())
    cal = evaluate.fit(pf.name, fp, scored, buckets=buckets)
    cal.notes = {"data": Path(args.data).name, "items": len(items), "buckets_used": buckets,
                 "held_out": result["held_out_per_bucket" if buckets else "held_out_per_type"], "raw": before}
    path = Path(args.out) if args.out else cache_dir() / "calibration" / f"{fp[:16]}.json"
    cal.save(path)
    result["temperatures"] = cal.parameters()
    result["saved"] = str(path)
    print(json.dumps(result, indent=2))
    return 0


def _serve(args) -> int:
    import uvicorn

    from .loading import ModelNotFound, resolve
    from .server import create_app
    try:
        resolve(args.model)  # a wrong path or a missing default model fails now, not in the background
    except ModelNotFound as e:
        print(f"prefill serve: {e}", file=sys.stderr)
        return 2
    keys = list(args.api_key) + [k.strip() for k in os.environ.get("PREFILL_API_KEYS", "").split(",") if k.strip()]
    app = create_app(lambda: _prefill(args).engine, api_keys=keys)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _read(value: str, as_json: bool) -> object:
    if value.startswith("@"):
        path = Path(value[1:])
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if as_json or path.suffix == ".json" else text
    return json.loads(value) if as_json else value


def _ask(args) -> int:
    from pydantic import TypeAdapter, ValidationError

    from .engine import RequestTooLarge
    from .loading import ModelNotFound
    from .schema import Question, SystemOneResponse
    try:
        state = _read(args.state, as_json=False)
        questions = TypeAdapter(dict[str, Question]).validate_python(_read(args.questions, as_json=True))
    except (OSError, json.JSONDecodeError, ValidationError) as e:
        print(f"prefill ask: {e}", file=sys.stderr)
        return 2
    try:
        pf = _prefill(args)
        answers, usage = pf.engine.ask(state, questions, args.reference_date)
    except (ModelNotFound, RequestTooLarge) as e:
        print(f"prefill ask: {e}", file=sys.stderr)
        return 2
    out = SystemOneResponse(model=pf.name, answers=answers, usage=usage) if args.usage else answers
    dumped = out.model_dump(mode="json") if args.usage else {k: v.model_dump(mode="json") for k, v in answers.items()}
    json.dump(dumped, sys.stdout, ensure_ascii=False, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
