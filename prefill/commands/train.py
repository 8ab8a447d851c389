"""prefill train: readout heads on the frozen model (or a LoRA with its head), from labels or a teacher."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..backends.base import ReadoutUnsupported
from ..settings import Settings
from .common import add_kind_argument, build_prefill, labelled_items

HELP = "train readout heads on the frozen model, distilled from a teacher (RLCD)"
# Where a head on the encoder route may serve better, and where the numbers are:
# docs/measurements/encoder-vs-decoder.md.
ENCODER_HINT = (
    "prefill train: for one or two questions on short texts, a head on the encoder route may be as "
    "accurate and faster: prefill train DATA --model embeddinggemma-300m (multilingual; `make encoders`) "
    "or all-minilm-l6-v2 (English, fastest); docs/measurements/encoder-vs-decoder.md has the numbers"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="+", help="labelled JSONL files: {state, questions, gold[, family]} per line")
    p.add_argument(
        "--teacher",
        action="append",
        default=[],
        help="recorded {request, response} JSONL (prefill record, or any System One server's); "
        "repeatable; without it the gold labels are the target",
    )
    p.add_argument("--label-weight", type=float, default=0.5, help="weight of the gold label in the target")
    add_kind_argument(
        p, "linear", ("lora",), "; lora: a LoRA on the top layers trained with a linear head (lora.py), heavier"
    )
    p.add_argument("--lora-layers", type=int, default=8, help="lora: how many top decoder layers get the adapter")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4, help="lora: at most this many (the best on validation is kept)")
    p.add_argument(
        "--validation-family",
        default=None,
        help="lora: the family left out to choose the epoch and fit temperatures (default: the smallest)",
    )
    p.add_argument(
        "--rl-weight",
        type=float,
        default=0.0,
        help="weight of the RLCD term (default 0, cross-entropy only: the RL term did not help "
        "consistently in the ablation in docs/measurements/trained-readouts.md)",
    )
    p.add_argument(
        "--early-layer",
        type=int,
        default=None,
        help="also train an early-exit head here (default: a third of the depth for data of several "
        "families, none for one task, as measured; 0: none)",
    )
    p.add_argument("--exclude-families", default="", help="comma-separated families never trained on")
    p.add_argument(
        "--out", required=True, help="a folder: final.* and early.* (safetensors + json), and lora/ for --kind lora"
    )


def run(settings: Settings, args) -> int:
    try:
        return _train(settings, args)
    except ReadoutUnsupported as e:  # e.g. a model that runs as rows, or a question over one chunk
        print(f"prefill train: {e}", file=sys.stderr)
        return 2


def _fail(message: str) -> int:
    print(f"prefill train: {message}", file=sys.stderr)
    return 2


def _train(settings: Settings, args) -> int:
    from ..training import lora
    from ..training import train as training

    if args.kind == "lora" and settings.dtype is None:
        settings = settings.replace(
            dtype="float32"
        )  # a LoRA's gradients flow through the base weights: fp32 unless asked
    excluded = {f for f in args.exclude_families.split(",") if f}
    items = [it for it in labelled_items(args.data, "train") if it.family not in excluded]
    pf = build_prefill(settings, "train")
    teacher: dict = {}
    for path in args.teacher:
        teacher.update(training.read_records(path))
    early_layer = args.early_layer
    if not pf.backend.exits_early:  # the encoder route: one pass reads every layer anyway
        if args.kind == "lora" or early_layer:
            return _fail("on the encoder route heads read the last layer only (no --kind lora, no --early-layer)")
        early_layer = 0
    layers = training.default_layers(pf.backend.depth, len({it.family for it in items}), early_layer)
    early = layers[0] if len(layers) > 1 else 0
    out = Path(args.out)
    if args.kind == "lora":
        if not 0 < args.lora_layers < pf.backend.depth or early > pf.backend.depth - args.lora_layers:
            return _fail(
                f"--lora-layers must be 1..{pf.backend.depth - 1} and leave the early-exit layer ({early}) "
                "below the adapter"
            )
        report = lora.train_adapter(
            pf.backend,
            items,
            teacher,
            early=early,
            top_layers=args.lora_layers,
            rank=args.lora_rank,
            epochs=args.epochs,
            validation_family=args.validation_family,
            rl_weight=args.rl_weight,
            label_weight=args.label_weight,
            model=pf.name,
            out=out,
        )
    else:
        report = training.train_heads(
            pf.backend,
            items,
            teacher,
            layers,
            kind=args.kind,
            model=pf.name,
            rl_weight=args.rl_weight,
            label_weight=args.label_weight,
            out=out,
        )
    report["excluded_families"] = sorted(excluded)
    print(json.dumps(report, indent=2))
    if args.kind != "lora" and pf.backend.exits_early:
        print(ENCODER_HINT, file=sys.stderr)
    return 0
