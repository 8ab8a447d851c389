"""The `prefill` command: serve, ask, batch, eval, calibrate, train, record, bench."""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import sys
from pathlib import Path

from .backends.cpu import DTYPES
from .engine import DEFAULT_MAX_REQUEST_TOKENS, DEFAULT_MAX_SEQUENCE_TOKENS
from .serving.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, DEFAULT_MAX_WAIT_S
from .render import DEFAULT_NOUL_WORDS, DEFAULT_SCORE_WORDS, DEFAULT_SYSTEM


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prefill", description="Typed decisions from a language model in one prefill pass.")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default=None,
                       help="an embedded model (qwen2.5-coder-0.5b-instruct, the default; smollm2-135m-instruct, 3x faster "
                            "but at chance on real text), a Hugging Face model id, a local model directory or a .gguf file")
        p.add_argument("--dtype", default=None, choices=DTYPES,
                       help="auto (the default, or PREFILL_DTYPE): bfloat16 where the CPU has bf16 matrix units (AMX, AVX-512 bf16) or on a "
                            "GPU, float32 elsewhere; float32 is the exact reference path (README \"The CPU's matrix units\")")
        p.add_argument("--route", default="auto", choices=["auto", "decoder", "encoder"],
                       help="decoder: a causal LM, one pass over a token tree; encoder: a bidirectional encoder with a "
                            "[MASK] slot per option, one sequence per question (README 'Encoder route'); auto: by the "
                            "model's type")
        p.add_argument("--backend", default="torch", choices=["torch", "vllm"],
                       help="torch: the token-tree engine (the reference); vllm: vLLM's paged KV cache and prefix "
                            "caching, the same answers, no trained readouts (make vllm-setup; README 'vLLM backend')")
        p.add_argument("--packing", default="auto", choices=["auto", "packed", "rows"],
                       help="packed: one tree-masked pass; rows: a row per answer over the cached state (for models that ignore masks)")
        p.add_argument("--no-chat", action="store_true", help="use a plain prompt instead of the model's chat template")
        p.add_argument("--system", default="on" if DEFAULT_SYSTEM else "off", choices=["on", "off"],
                       help="prefill's instruction as a system turn, or only the text and the question "
                            f"(default {'on' if DEFAULT_SYSTEM else 'off'})")
        p.add_argument("--noul-words", default=DEFAULT_NOUL_WORDS, choices=["yesno", "truefalse"],
                       help=f"the two answers of a yes/no question: Yes/No or True/False (default {DEFAULT_NOUL_WORDS})")
        p.add_argument("--score-words", default=DEFAULT_SCORE_WORDS, choices=["numbers", "names"],
                       help=f"a score question's levels answered by number or by their own words (default {DEFAULT_SCORE_WORDS})")
        p.add_argument("--scoring", action="append", default=[], metavar="TYPE=READOUT[+CORRECTION]",
                       help="how answers are read for a question type (noul, choice, score or all), e.g. "
                            "choice=first or all=whole+pmi; readouts whole|noend|mean|first, corrections "
                            "contextual|pmi|none (default: whole+pmi for every type; README 'Real text')")
        p.add_argument("--max-request-tokens", type=int, default=DEFAULT_MAX_REQUEST_TOKENS,
                       help="the most tokens one request may use (default %(default)s)")
        p.add_argument("--max-sequence-tokens", type=int, default=DEFAULT_MAX_SEQUENCE_TOKENS,
                       help="the most tokens of the state plus its longest question and answer (default "
                            "%(default)s; never more than the model's context)")
        p.add_argument("--calibration", default="auto",
                       help="auto (the temperatures fitted for this model, if any), a calibration file, or none")
        p.add_argument("--facts", default="on", choices=["on", "off"],
                       help="answer single numeric and date comparisons exactly, by parsing (default on)")
        p.add_argument("--readout", action="append", default=[], metavar="[NAME=]DIR",
                       help="a trained readout (prefill train's folder or file), read instead of the log-likelihoods; "
                            "serve: repeatable, each served as model NAME (default: base+folder) beside the plain "
                            "base, all on one copy of the weights (a LoRA readout must be served alone)")
        p.add_argument("--fallback-below", type=float, default=None,
                       help="questions whose confidence, (p_max - 1/n)/(1 - 1/n), is under this are escalated "
                            "(--fallback-url or --fallback-model) or listed in x_low_confidence")
        p.add_argument("--fallback-url", default=None,
                       help="a server for low-confidence questions: another System One server, or with "
                            "--fallback-kind openai an OpenAI-compatible chat endpoint (its base URL)")
        p.add_argument("--fallback-kind", default="systemone", choices=["systemone", "openai"])
        p.add_argument("--fallback-model", default=None,
                       help="with --fallback-url: the model name to ask there (System One default jev-latest; "
                            "required for openai); without: a stronger local model loaded in this process")
        p.add_argument("--fallback-key", default=os.environ.get("PREFILL_FALLBACK_KEY"),
                       help="Bearer key for --fallback-url (also PREFILL_FALLBACK_KEY)")
        p.add_argument("--fallback-timeout", type=float, default=10.0,
                       help="seconds to wait for --fallback-url before keeping the local answer (default 10)")

    serve = sub.add_parser("serve", help="serve the TypeSafe System One API")
    model_options(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", action="append", default=[],
                       help="require this Bearer key (repeatable; also PREFILL_API_KEYS, comma-separated)")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--default-model", default=None,
                       help="the served model the jev-* aliases point to (default: the first --readout, else the base)")
    serve.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                       help="requests that may be in at once, waiting or running; past it, 429 with Retry-After "
                            "(default %(default)s: 4 per CPU core)")
    serve.add_argument("--max-wait", type=float, default=DEFAULT_MAX_WAIT_S,
                       help="seconds a request may wait in the queue before it is dropped with 503 + Retry-After "
                            "(default %(default)s)")
    serve.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                       help="waiting requests run together in shared passes, at most this many (default %(default)s)")
    serve.add_argument("--replicas", type=int, default=0,
                       help="serve N engine replicas behind Ray Serve, requests about one state to one replica "
                            '(pip install "prefill[ray]"; default: one process, no Ray)')
    serve.add_argument("--max-replicas", type=int, default=None,
                       help="with --replicas N: autoscale between N and this many replicas on ongoing requests "
                            "per replica (target: --max-batch)")
    serve.add_argument("--ray-address", default=None, help="with --replicas: the Ray cluster to join (default: a local one)")
    serve.add_argument("--batching", default="on", choices=["on", "off"],
                       help="cross-request batching (default on; README 'Serving under load' has the measurement)")

    ask = sub.add_parser("ask", help="answer questions about a state, JSON out")
    model_options(ask)
    ask.add_argument("--state", required=True, help="the state text, or @FILE (a .json file is read as JSON)")
    ask.add_argument("--questions", required=True, help="questions as JSON {id: question}, or @FILE")
    ask.add_argument("--usage", action="store_true", help="print the whole response, usage included")
    ask.add_argument("--reference-date", type=dt.date.fromisoformat, default=None,
                     help="today, for date questions (YYYY-MM-DD; default: the date the state gives, if any)")

    bt = sub.add_parser("batch", help="answer the same questions for every row of a JSONL, CSV or Parquet file")
    model_options(bt)
    bt.add_argument("input", help="rows: .jsonl, .csv or .parquet")
    bt.add_argument("--questions", required=True, help="questions as JSON {id: question}, or @FILE")
    bt.add_argument("--out", required=True, help="the rows plus the answers: .jsonl, .csv or .parquet; rerun the "
                                                 "same command to continue an interrupted job")
    bt.add_argument("--state-field", default=None,
                    help="the field or column that is the state (default: the whole record is the state)")
    bt.add_argument("--on-error", default="skip", choices=["skip", "stop"],
                    help="a row that cannot be answered: record it in prefill_error and go on, or stop (default skip)")
    bt.add_argument("--batch-size", type=int, default=16, help="rows run together in shared passes (default 16)")
    bt.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                    help="spread the rows over engine actors with Ray Data: a local Ray, or the cluster at ADDRESS")
    bt.add_argument("--ray-actors", type=int, default=2, help="with --ray: engine actors, each with its own model "
                                                              "copy and an equal share of the CPUs (default 2)")

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

    tr = sub.add_parser("train", help="train readout heads on the frozen model, distilled from a teacher (RLCD)")
    model_options(tr)
    tr.add_argument("data", nargs="+", help="labelled JSONL files: {state, questions, gold[, family]} per line")
    tr.add_argument("--teacher", action="append", default=[],
                    help="recorded {request, response} JSONL (prefill record, or any System One server's); "
                         "repeatable; without it the gold labels are the target")
    tr.add_argument("--label-weight", type=float, default=0.5, help="weight of the gold label in the target")
    tr.add_argument("--kind", default="linear", choices=["linear", "pointer", "mlp", "lora"],
                    help="lora: a LoRA on the top layers trained with a linear head (lora.py); heavier, slower")
    tr.add_argument("--lora-layers", type=int, default=8, help="lora: how many top decoder layers get the adapter")
    tr.add_argument("--lora-rank", type=int, default=8)
    tr.add_argument("--epochs", type=int, default=4, help="lora: at most this many (the best on validation is kept)")
    tr.add_argument("--validation-family", default=None,
                    help="lora: the family left out to choose the epoch and fit temperatures (default: the smallest)")
    tr.add_argument("--rl-weight", type=float, default=0.0,
                    help="weight of the RLCD term (default 0, cross-entropy only: the RL term did not help "
                         "consistently in the README's ablation)")
    tr.add_argument("--early-layer", type=int, default=None,
                    help="also train an early-exit head here (default: a third of the depth for data of several "
                         "families, none for one task, as measured; 0: none)")
    tr.add_argument("--exclude-families", default="", help="comma-separated families never trained on")
    tr.add_argument("--out", required=True, help="a folder: final.* and early.* (safetensors + json), and lora/ for --kind lora")

    rec = sub.add_parser("record", help="answer labelled JSONL and write {request, response} lines (a teacher for prefill train)")
    model_options(rec)
    rec.add_argument("data", help="labelled JSONL: {state, questions, gold} per line")
    rec.add_argument("--out", required=True, help="JSONL of System One requests and responses")

    bench = sub.add_parser("bench", help="measure speed against generation and per-question passes (see prefill/bench.py)")
    model_options(bench)
    from .bench import add_arguments
    add_arguments(bench)

    args = parser.parse_args(argv)
    if getattr(args, "backend", "torch") == "vllm":
        _check_vllm(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "eval":
        return _eval(args)
    if args.command == "batch":
        return _batch(args)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "record":
        return _record(args)
    if args.command == "train":
        from .backends.base import ReadoutUnsupported
        try:
            return _train(args)
        except ReadoutUnsupported as e:  # e.g. a model that runs as rows, or a question over one chunk
            print(f"prefill train: {e}", file=sys.stderr)
            return 2
    if args.command == "bench":
        from .bench import run
        print(json.dumps(run(args), indent=2))
        return 0
    return _ask(args)


def _prefill(args):
    """The Prefill the options describe: the base model, a readout, the fallback. `prefill serve`'s
    further readouts are added by `_engines`."""
    from .api import Prefill
    from .fallback import remote
    fallback = None
    if args.fallback_url:
        fallback = remote(args.fallback_url, args.fallback_kind, model=args.fallback_model,
                          api_key=args.fallback_key, timeout=args.fallback_timeout)
    elif args.fallback_model:
        fallback = Prefill(args.fallback_model, dtype=args.dtype, max_request_tokens=args.max_request_tokens,
                           facts=args.facts == "on").engine
    readouts = readout_options(args.readout)
    if len(readouts) > 1 and args.command != "serve":
        _usage_error(f"prefill {args.command} takes one --readout (prefill serve takes several)")
    # Elsewhere than serve, and for a LoRA readout (which changes the weights), the readout is the engine.
    first = readouts[0] if readouts and (args.command != "serve" or _has_adapter(readouts[0][1])) else None
    pf = Prefill(args.model, dtype=args.dtype, chat=False if args.no_chat else None, packing=args.packing,
                 system=args.system == "on", noul_words=args.noul_words, score_words=args.score_words,
                 scoring=_scoring(args.scoring),
                 max_request_tokens=args.max_request_tokens, max_sequence_tokens=args.max_sequence_tokens,
                 calibration=None if args.calibration == "none" else args.calibration,
                 facts=args.facts == "on", readout=first[1] if first else None,
                 fallback_below=args.fallback_below, fallback=fallback, backend=args.backend, route=args.route)
    if first and first[0]:
        pf.engine.served_as = first[0]
        pf.engines = {pf.engine.name: pf.engine}
    from .backends.encoder import EncoderBackend
    if not readouts and args.command in ("ask", "serve", "eval", "batch") and isinstance(pf.backend, EncoderBackend):
        # a newcomer's first question on an encoder gets a near-uniform answer: say why, and what to do
        print(f"prefill: {pf.name} is on the encoder route with no trained head, where answers are at chance (near "
              f"uniform: measured on twelve tasks); train one: prefill train DATA --model {pf.name} --out HEAD, "
              "then --readout HEAD (README 'Encoder route vs decoder route')", file=sys.stderr)
    return pf


def _check_vllm(args) -> None:
    """--backend vllm: what it cannot do, told at once (exit 2) rather than after vLLM has started."""
    import importlib.util

    from .backends.vllm_lm import NO_READOUTS
    if args.route == "encoder":
        _usage_error("the encoder route runs on the torch backend only")
    if args.command in ("train", "bench"):
        _usage_error(f"prefill {args.command} needs the torch backend (it reads hidden states or times torch passes)")
    if args.readout:
        _usage_error(f"--readout with --backend vllm: {NO_READOUTS}")
    if getattr(args, "generate", False):
        _usage_error("eval --generate needs the torch backend")
    if importlib.util.find_spec("vllm") is None:
        _usage_error("--backend vllm needs vLLM: `make vllm-setup` (a second venv, .venv-vllm), or "
                     "pip install 'prefill[vllm]' then pip uninstall torchvision torchaudio torchcodec")


def _usage_error(message: str) -> None:
    print(f"prefill: {message}", file=sys.stderr)
    raise SystemExit(2)


def readout_options(values: list[str]) -> list[tuple[str | None, str]]:
    """--readout [NAME=]DIR values as (name or None, path)."""
    out = []
    for value in values:
        name, sep, path = value.partition("=")
        out.append((name, path) if sep and name and not Path(value).exists() else (None, value))
    return out


def _has_adapter(path: str) -> bool:
    from .readout import Readouts
    try:
        return Readouts.load(path).adapter is not None
    except (OSError, ValueError):
        return False  # reported when it is loaded for real


def _engines(args):
    """What `prefill serve` serves: the plain base model under its own name and every --readout beside it,
    all on one copy of the weights and one state cache; the jev-* aliases point to --default-model (default:
    the first readout). A readout trained with a LoRA changes the weights: it is served alone."""
    from .serving.app import Served
    pf = _prefill(args)
    if pf.engine.readouts is None:  # (a LoRA readout among others was refused by _check_serve)
        for name, path in readout_options(args.readout):
            pf.add_readout(path, name)
    default = args.default_model or (list(pf.engines)[1] if len(pf.engines) > 1 else pf.engine.name)
    return Served.of(pf.engines, default)


def _scoring(values: list[str]) -> dict[str, str] | None:
    """--scoring TYPE=WAY options as {type: way}; `all` sets every type, later options win. A bad one is a
    clear exit 2."""
    from .scoring import Scoring
    out: dict[str, str] = {}
    for value in values:
        qtype, sep, way = value.partition("=")
        try:
            if not sep or qtype not in ("noul", "choice", "score", "all"):
                raise ValueError("TYPE must be noul, choice, score or all")
            Scoring.parse(way)
        except ValueError as e:
            print(f"prefill: --scoring takes TYPE=READOUT[+CORRECTION], not {value!r}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        out.update(dict.fromkeys(("noul", "choice", "score") if qtype == "all" else (qtype,), way))
    return out or None


def _scored(args, facts: bool):
    from . import evaluate
    from .engine import Engine
    items = evaluate.load_jsonl(args.data)
    pf = _prefill(args)
    raw = Engine(pf.backend, max_request_tokens=pf.engine.max_request_tokens, use_facts=facts,
                 readouts=pf.engine.readouts, scoring=pf.engine.scoring)  # uncalibrated
    return pf, items, evaluate.predict(raw, items)


def _eval(args) -> int:
    from . import evaluate
    pf, items, scored = _scored(args, facts=args.facts == "on")
    if args.generate and not hasattr(getattr(pf.backend, "model", None), "generate"):
        print("prefill eval: --generate needs a model that generates (the decoder route)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": pf.name, "fingerprint": pf.backend.fingerprint, "data": args.data, "items": len(items),
              "facts": args.facts, "raw": evaluate.report(scored)}
    cal = None if pf.engine.readouts else pf.engine.calibration  # a trained head carries its own calibration
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
    from .api import setup
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
    cal.setup = setup(pf.backend.renderer, pf.engine.scoring)
    cal.notes = {"data": Path(args.data).name, "items": len(items), "buckets_used": buckets,
                 "held_out": result["held_out_per_bucket" if buckets else "held_out_per_type"], "raw": before}
    path = Path(args.out) if args.out else cache_dir() / "calibration" / f"{fp[:16]}.json"
    cal.save(path)
    result["temperatures"] = cal.parameters()
    result["saved"] = str(path)
    print(json.dumps(result, indent=2))
    return 0


def _train(args) -> int:
    from . import evaluate, training
    if args.kind == "lora" and args.dtype is None:
        args.dtype = "float32"  # a LoRA's gradients flow through the base weights: trained in fp32 unless asked
    pf = _prefill(args)
    excluded = {f for f in args.exclude_families.split(",") if f}
    items = [it for path in args.data for it in evaluate.load_jsonl(path) if it.family not in excluded]
    teacher = {}
    for path in args.teacher:
        teacher.update(training.read_records(path))
    if not hasattr(pf.backend, "features_early_exit"):  # the encoder route: one pass reads every layer anyway
        if args.kind == "lora" or args.early_layer:
            print("prefill train: on the encoder route heads read the last layer only (no --kind lora, no "
                  "--early-layer)", file=sys.stderr)
            return 2
        args.early_layer = 0
    layers = training.default_layers(pf.backend.depth, len({it.family for it in items}), args.early_layer)
    early = layers[0] if len(layers) > 1 else 0
    if args.kind == "lora":
        return _train_lora(args, pf, items, teacher, early, excluded)
    examples = training.extract(pf.backend, items, layers, teacher)
    final, early_head, report = training.fit_readouts(
        examples, layers, kind=args.kind, model=pf.name, fingerprint=pf.backend.fingerprint,
        rl_weight=args.rl_weight, label_weight=args.label_weight if teacher else 1.0, progress=True)
    out = Path(args.out)
    final.save(out / "final.json")
    if early_head is not None:
        early_head.save(out / "early.json")
    report.update(items=len(items), questions=len(examples), with_teacher=sum(e.teacher is not None for e in examples),
                  excluded_families=sorted(excluded), layers=layers, saved=str(out))
    print(json.dumps(report, indent=2))
    if hasattr(pf.backend, "features_early_exit"):
        print(ENCODER_HINT, file=sys.stderr)
    return 0


# Measured (README "Encoder route vs decoder route", 100 training items per task): a head on EmbeddingGemma-300M
# beat the one on Qwen2.5-Coder-0.5B on Dutch reviews (0.868 vs 0.765), matched it on French and German reviews
# and spam, and answers one question on a 128- or 512-token text ~4x faster; on many questions or long texts the
# decoder route is faster, and on hedged English sentences it was more accurate.
ENCODER_HINT = ("prefill train: for one or two questions on short texts, a head on the encoder route may be as "
                "accurate and faster: prefill train DATA --model embeddinggemma-300m (multilingual; `make encoders`) "
                "or all-minilm-l6-v2 (English, fastest). With 100 labels, EmbeddingGemma beat Qwen's head on Dutch "
                "reviews and matched it on French, German and spam, ~4x faster for one question on a short text; "
                "README 'Encoder route vs decoder route'")


def _train_lora(args, pf, items, teacher, early: int, excluded: set[str]) -> int:
    from . import lora, training
    cut = pf.backend.depth - args.lora_layers
    if not 0 < args.lora_layers < pf.backend.depth or early > cut:
        print(f"prefill train: --lora-layers must be 1..{pf.backend.depth - 1} and leave the early-exit layer "
              f"({early}) below the adapter", file=sys.stderr)
        return 2
    label_weight = args.label_weight if teacher else 1.0
    units = lora.extract(pf.backend, items, cut, teacher)
    fit, validation, held = lora.split_by_family(units, args.validation_family)
    peft_model, final, log = lora.train(pf.backend, fit, validation, top_layers=args.lora_layers,
                                        rank=args.lora_rank, epochs=args.epochs, label_weight=label_weight,
                                        rl_weight=args.rl_weight, model=pf.name, fingerprint=pf.backend.fingerprint)
    out = Path(args.out)
    peft_model.save_pretrained(out / "lora")
    final.save(out / "final.json")
    report = {"final": log, "validation": held}
    if early:
        # the early head reads a layer below the adapter, so the adapter does not change what it reads
        examples = training.extract(pf.backend, items, [early], teacher)
        held_items = {u.item for u in validation}
        early_head, report["early"] = training.fit_early(
            [e for e in examples if e.item not in held_items], [e for e in examples if e.item in held_items],
            lora.predict(pf.backend, final, validation), early, 0, model=pf.name,
            fingerprint=pf.backend.fingerprint, rl_weight=args.rl_weight, label_weight=label_weight)
        early_head.save(out / "early.json")
    report.update(items=len(items), excluded_families=sorted(excluded), saved=str(out))
    print(json.dumps(report, indent=2))
    return 0


def _record(args) -> int:
    """The same lines any System One server's logs would give: what prefill train reads as a teacher."""
    from . import evaluate
    from .schema import SystemOneResponse
    pf = _prefill(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        from tqdm import tqdm
        for item in tqdm(evaluate.load_jsonl(args.data), desc="recording", unit="item", file=sys.stderr):
            answers, usage = pf.engine.ask(item.state, item.questions, item.reference_date)
            request = {"model": pf.name, "state": item.state,
                       "questions": {k: q.model_dump(mode="json", exclude_none=True) for k, q in item.questions.items()}}
            response = SystemOneResponse(model=pf.name, answers=answers, usage=usage).model_dump(mode="json")
            f.write(json.dumps({"request": request, "response": response}, ensure_ascii=False) + "\n")
    return 0


def _serve(args) -> int:
    import uvicorn

    from .backends.cpu import resolve_dtype
    from .loading import ModelNotFound, resolve
    try:
        base = resolve(args.model, resolve_dtype(args.dtype)).name  # a wrong path or a missing default model fails now, not in the background
        _check_serve(args, base)
    except (ModelNotFound, ValueError) as e:
        print(f"prefill serve: {e}", file=sys.stderr)
        return 2
    keys = list(args.api_key) + [k.strip() for k in os.environ.get("PREFILL_API_KEYS", "").split(",") if k.strip()]
    if args.replicas:
        try:
            from .serving import replicas
        except ImportError:
            print('prefill serve: --replicas needs Ray Serve: pip install "prefill[ray]"', file=sys.stderr)
            return 2
        replicas.run(functools.partial(_app, args, keys, loaded=True), replicas=args.replicas, host=args.host,
                     port=args.port, address=args.ray_address, max_replicas=args.max_replicas,
                     target_ongoing_requests=args.max_batch)
        return 0
    uvicorn.run(_app(args, keys), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _app(args, keys: list[str], loaded: bool = False):
    """`prefill serve`'s app: the engines load in the background (or here, `loaded`: a Ray Serve replica,
    which is ready when its constructor returns)."""
    from .serving.app import create_app
    return create_app(_engines(args) if loaded else functools.partial(_engines, args), api_keys=keys,
                      max_queue=args.max_queue, max_wait_s=args.max_wait, max_batch=args.max_batch,
                      batching=args.batching == "on")


def _check_serve(args, base: str) -> None:
    """What can be told before loading the model, told at start-up (exit 2) rather than as a 503 later."""
    from .api import LORA_CANNOT_SHARE
    from .readout import Readouts
    if args.max_replicas is not None and not 0 < args.replicas <= args.max_replicas:
        raise ValueError("--max-replicas M needs --replicas N with 0 < N <= M (N: the fewest replicas)")
    readouts = readout_options(args.readout)
    for _, path in readouts:
        if not Path(path).exists():
            raise ValueError(f"--readout {path}: no such file or folder")
    if len(readouts) > 1 and any(_has_adapter(path) for _, path in readouts):
        raise ValueError(LORA_CANNOT_SHARE)
    names = [base] + [name or f"{base}+{Readouts.load(path).name}" for name, path in readouts]
    if len(set(names)) < len(names):
        raise ValueError(f"two served models would have the same name ({names}); name them: --readout NAME=DIR")
    if args.default_model and args.default_model not in names:
        raise ValueError(f"--default-model {args.default_model!r} is not served; served: {names}")
    if args.fallback_url and args.fallback_kind == "openai" and not args.fallback_model:
        raise ValueError("--fallback-kind openai needs --fallback-model, the model name the chat server serves")


def _read(value: str, as_json: bool) -> object:
    if value.startswith("@"):
        path = Path(value[1:])
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if as_json or path.suffix == ".json" else text
    return json.loads(value) if as_json else value


def _ask(args) -> int:
    from pydantic import ValidationError

    from .loading import ModelNotFound
    from .schema import SystemOneResponse, wire_questions
    try:
        state = _read(args.state, as_json=False)
        questions = wire_questions(_read(args.questions, as_json=True))
    except (OSError, json.JSONDecodeError, ValidationError) as e:
        print(f"prefill ask: {e}", file=sys.stderr)
        return 2
    try:
        pf = _prefill(args)
        answers, usage = pf.engine.ask(state, questions, args.reference_date)
    except (ModelNotFound, ValueError) as e:  # ValueError: options the model cannot take; RequestTooLarge
        print(f"prefill ask: {e}", file=sys.stderr)
        return 2
    out = SystemOneResponse(model=pf.name, answers=answers, usage=usage) if args.usage else answers
    dumped = out.model_dump(mode="json") if args.usage else {k: v.model_dump(mode="json") for k, v in answers.items()}
    json.dump(dumped, sys.stdout, ensure_ascii=False, indent=2)
    print()
    return 0


def _engine(args):
    """The engine the model options describe (picklable as functools.partial(_engine, args): Ray actors)."""
    return _prefill(args).engine


def _batch(args) -> int:
    from .batch import BatchError, RowFailed, load_questions, ray_answers, run
    from .loading import ModelNotFound
    source, out = Path(args.input), Path(args.out)
    try:
        if not source.exists():
            raise BatchError(f"{source}: no such file")
        questions = load_questions(_read(args.questions, as_json=True))
        if args.ray:  # the engines load in the actors, not here
            try:
                import ray  # noqa: F401
            except ImportError:
                raise BatchError('--ray needs Ray: pip install "prefill[ray]"') from None
            engine, answer = None, ray_answers(functools.partial(_engine, args), questions, args.state_field,
                                               actors=args.ray_actors,
                                               address=None if args.ray == "local" else args.ray)
        else:
            engine, answer = _prefill(args).engine, None
        summary = run(engine, source, questions, out, state_field=args.state_field, on_error=args.on_error,
                      batch_size=args.batch_size, answer=answer)
    except (BatchError, ModelNotFound, OSError, json.JSONDecodeError) as e:  # RowFailed: the job; the rest: usage
        print(f"prefill batch: {e}", file=sys.stderr)
        return 1 if isinstance(e, RowFailed) else 2
    except KeyboardInterrupt:
        print("\nprefill batch: interrupted; the finished rows are kept: rerun the same command to continue",
              file=sys.stderr)
        return 130
    skipped = f", {len(summary.skipped)} skipped (lines {', '.join(str(n) for n, _ in summary.skipped[:20])}" + \
        (" ..." if len(summary.skipped) > 20 else "") + f"; see {out}'s prefill_error column)" if summary.skipped else ""
    resumed = f" (continued after {summary.resumed_from} rows done before)" if summary.resumed_from else ""
    print(f"prefill batch: {summary.answered} rows answered{resumed}{skipped} -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
