"""What the commands share: the model the settings describe, reading @FILE arguments, usage errors."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from ..settings import AUTO_HEAD_KINDS, HEAD_KINDS, Settings


def usage_error(message: str) -> None:
    print(f"prefill: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_arg(value: str, as_json: bool) -> object:
    """A command-line value, or @FILE's contents (a .json file, or `as_json`, parsed as JSON)."""
    if value.startswith("@"):
        path = Path(value[1:])
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if as_json or path.suffix == ".json" else text
    return json.loads(value) if as_json else value


def labelled_items(paths: list[str], command: str) -> list:
    """The labelled JSONL files' items (evaluate.load_jsonl), read before any model loads; a file that is
    not there or a line that is not a labelled item is a usage error naming the file and line."""
    from ..evaluation import evaluate

    try:
        return [item for path in paths for item in evaluate.load_jsonl(path)]
    except ValueError as e:
        print(f"prefill {command}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def has_adapter(path: str) -> bool:
    from ..heads import Heads

    try:
        return Heads.load(path).adapter is not None
    except (OSError, ValueError):
        return False  # reported when it is loaded for real


def build_prefill(settings: Settings, command: str, plan=None):
    """The Prefill the settings describe, for `command`: the base model with the fallback, and the readout
    it reads. Elsewhere than serve, and for a LoRA readout (which changes the weights), the one readout is
    the engine; `prefill serve` adds its readouts beside the base (commands/serve.py). `plan`: build.plan's,
    where the command made it already."""
    from ..api import Prefill
    from ..loading import ModelNotFound

    readouts = settings.readouts
    if len(readouts) > 1 and command != "serve":
        usage_error(f"prefill {command} takes one --readout (prefill serve takes several)")
    first = readouts[0] if readouts and (command != "serve" or has_adapter(readouts[0][1])) else None
    try:
        pf = Prefill(settings=settings.replace(readouts=(first,) if first else ()), plan=plan)
    except (ModelNotFound, ValueError) as e:  # a model, readout or calibration that cannot be had, said plainly
        if command == "serve":  # loading in the background: reported on /health (serve checks at start-up)
            raise
        print(f"prefill {command}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if first and first[0]:
        pf.engine.served_as = first[0]
        pf.engines = {pf.engine.name: pf.engine}
    if not readouts and command in ("ask", "serve", "eval", "batch") and pf.backend.route == "encoder":
        # a newcomer's first question on an encoder gets a near-uniform answer: say why, and what to do
        print(
            f"prefill: {pf.name} is on the encoder route with no trained head, where answers are at chance (near "
            f"uniform: measured on twelve tasks); train one: prefill train DATA --model {pf.name} --out HEAD, "
            "then --readout HEAD (docs/measurements/encoder-vs-decoder.md)",
            file=sys.stderr,
        )
    return pf


def check_vllm(command: str, generate: bool = False) -> None:
    """--backend vllm: what it cannot do, told at once (exit 2) rather than after vLLM has started (the
    settings it cannot take are build.check's)."""
    if command in ("train", "bench"):
        usage_error(f"prefill {command} needs the torch backend (it reads hidden states or times torch passes)")
    if generate:
        usage_error("eval --generate needs the torch backend")
    if importlib.util.find_spec("vllm") is None:
        usage_error(
            "--backend vllm needs vLLM: `make vllm-setup` (a second venv, .venv-vllm), or "
            "pip install 'prefill[vllm]' then pip uninstall torchvision torchaudio torchcodec"
        )


def add_rows_arguments(p) -> None:
    """The rows and questions that `prefill batch` and `prefill distill` read, declared once."""
    p.add_argument("input", help="rows: .jsonl, .csv or .parquet")
    p.add_argument("--questions", required=True, help="questions as JSON {id: question}, or @FILE")
    p.add_argument(
        "--state-field", default=None, help="the field or column that is the state (default: the whole record)"
    )


def add_kind_argument(p, default: str, extra: tuple[str, ...] = (), more_help: str = "") -> None:
    """`--kind`, the trained head's kind, as `prefill train` and `prefill distill` both take it."""
    p.add_argument(
        "--kind",
        default=default,
        choices=[*HEAD_KINDS, "auto", *extra],
        help=f"the head (prefill/heads.py; default {default}): linear, pointer, mlp, classes (a weight vector per "
        f"answer taught: for fixed questions), or auto: whichever of {', '.join(AUTO_HEAD_KINDS)} has the lowest "
        f"held-out log loss{more_help}",
    )
