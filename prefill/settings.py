"""The model options, declared once: what model, how it runs, how answers are read, calibrated and escalated.

`Settings` is the one place an option lives: its field gives the default, and its metadata the command-line
flag, help and parsing, so adding an option is one field (plus its use). Every command that loads a model
takes these flags (`Settings.add_arguments`), reads them into a `Settings` (`Settings.from_args`), and
builds its model from it (`build.plan`, then `api.Prefill(settings=..., plan=...)`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .precision import DTYPES
from .render import CHOICE_WORDS, DEFAULT_CHOICE_WORDS, DEFAULT_NOUL_WORDS, DEFAULT_SCORE_WORDS, DEFAULT_SYSTEM
from .schema import DEFAULT_MAX_REQUEST_TOKENS, DEFAULT_MAX_SEQUENCE_TOKENS

# The kinds of trained head (heads.py), declared once: `prefill train` and `prefill distill` offer them as --kind,
# and `--kind auto` tries AUTO_HEAD_KINDS (training/train.py).
HEAD_KINDS = ("linear", "pointer", "mlp", "classes")
AUTO_HEAD_KINDS = ("linear", "pointer", "classes")


def flag(name: str, help: str, *, parse: Callable | None = None, **argparse_kw) -> dict:
    """A field's command-line form: `name` with argparse's keywords; `parse` turns the parsed value into
    the field's value (the flag's default goes through it too)."""
    return {"flag": name, "help": help, "parse": parse, "argparse": argparse_kw}


def on_off(value: str) -> bool:
    return value == "on"


def auto_on_off(value: str | bool | None) -> bool | None:
    """A switch with a default that depends on where it runs: "auto" (None), "on" (True), "off" (False)."""
    return {"auto": None, "on": True, "off": False}[value] if isinstance(value, str) else value


def readout_options(values: list[str]) -> tuple[tuple[str | None, str], ...]:
    """--readout [NAME=]DIR values as (name or None, path)."""
    out = []
    for value in values:
        name, sep, path = value.partition("=")
        out.append((name, path) if sep and name and not Path(value).exists() else (None, value))
    return tuple(out)


def scoring_options(values: list[str]) -> dict[str, str] | None:
    """--scoring TYPE=WAY values as {type: way}; `all` sets every type, later values win. A bad one raises
    ValueError, which the command line reports as a usage error."""
    from .scoring import ways_asked

    out: dict[str, str] = {}
    for value in values:
        qtype, sep, way = value.partition("=")
        try:
            out.update(dict.fromkeys(ways_asked({qtype: way} if sep else {"": way}), way))
        except ValueError as e:
            raise ValueError(f"--scoring takes TYPE=TOKENS[+CORRECTION], not {value!r}: {e}") from None
    return out or None


@dataclass(frozen=True)
class Settings:
    model: str | None = field(
        default=None,
        metadata=flag(
            "--model",
            "an embedded model (the default: qwen2.5-coder-1.5b-instruct on a CPU with bf16 units, "
            "qwen2.5-coder-0.5b-instruct in fp32; smollm2-135m-instruct, 3x faster than the 0.5B but at chance on real "
            "text), a Hugging Face model id, a local model directory or a .gguf file",
        ),
    )
    dtype: str | None = field(
        default=None,
        metadata=flag(
            "--dtype",
            "auto (the default, or PREFILL_DTYPE): bfloat16 where the CPU has bf16 matrix units (AMX, "
            "AVX-512 bf16) or on a GPU, int8 on an x86 CPU with AVX2 and no bf16 units, float32 elsewhere; "
            "float32 is the exact reference path (docs/measurements/cpu-precision.md); int8: int8 products with a "
            "scale per token (docs/measurements/cpu-precision.md#without-bf16-units-int8)",
            choices=DTYPES,
        ),
    )
    exact: bool | None = field(
        default=None,
        metadata=flag(
            "--exact",
            "auto (the default): a question's answer is the same bits however it is packed with other questions "
            "or its request batched with others, wherever the torch decoder route runs on a CPU (bf16: the split "
            "attention and products in calls the kernel is exact on; int8 always); on: the same, refused where it "
            "cannot be had (vLLM, the encoder route); off: plain bf16, faster, its answers moving by up to a few "
            "hundredths with what is asked beside them (docs/models-and-precision.md#exact-answers)",
            choices=["auto", "on", "off"],
            nargs="?",
            const="on",
            parse=auto_on_off,
        ),
    )
    route: str = field(
        default="auto",
        metadata=flag(
            "--route",
            "decoder: a causal LM, one pass over a token tree; encoder: a bidirectional encoder with a "
            "[MASK] slot per option, one sequence per question (docs/models-and-precision.md#the-encoder-route); "
            "auto: by the model's type",
            choices=["auto", "decoder", "encoder"],
        ),
    )
    backend: str = field(
        default="torch",
        metadata=flag(
            "--backend",
            "torch: the token-tree engine (the reference); vllm: vLLM's paged KV cache and prefix "
            "caching, the same answers, no trained readouts (make vllm-setup; docs/design.md#the-vllm-backend)",
            choices=["torch", "vllm"],
        ),
    )
    packing: str = field(
        default="auto",
        metadata=flag(
            "--packing",
            "packed: one tree-masked pass; rows: a row per answer over the cached state (for models that ignore masks)",
            choices=["auto", "packed", "rows"],
        ),
    )
    chat: bool | None = field(
        default=None,
        metadata=flag(
            "--no-chat",
            "use a plain prompt instead of the model's chat template",
            action="store_true",
            parse=lambda no_chat: False if no_chat else None,
        ),
    )
    system: bool = field(
        default=DEFAULT_SYSTEM,
        metadata=flag(
            "--system",
            "prefill's instruction as a system turn, or only the text and the question (default "
            f"{'on' if DEFAULT_SYSTEM else 'off'})",
            choices=["on", "off"],
            parse=on_off,
        ),
    )
    noul_words: str = field(
        default=DEFAULT_NOUL_WORDS,
        metadata=flag(
            "--noul-words",
            f"the two answers of a yes/no question: Yes/No or True/False (default {DEFAULT_NOUL_WORDS})",
            choices=["yesno", "truefalse"],
        ),
    )
    score_words: str = field(
        default=DEFAULT_SCORE_WORDS,
        metadata=flag(
            "--score-words",
            f"a score question's levels answered by number or by their own words (default {DEFAULT_SCORE_WORDS})",
            choices=["numbers", "names"],
        ),
    )
    choice_words: str = field(
        default=DEFAULT_CHOICE_WORDS,
        metadata=flag(
            "--choice-words",
            f"a choice's options answered by name or by their number in the listing (default {DEFAULT_CHOICE_WORDS})",
            choices=list(CHOICE_WORDS),
        ),
    )
    scoring: dict[str, str] | None = field(
        default=None,
        metadata=flag(
            "--scoring",
            "how answers are read for a question type (noul, choice, score or all), e.g. choice=first, "
            "all=whole+pmi or choice=whole+pmi*0.5 (a weight on the prior); token rules whole|noend|mean|first, "
            "corrections contextual|pmi|none (default: whole+pmi for every type; docs/measurements/real-tasks.md)",
            action="append",
            metavar="TYPE=TOKENS[+CORRECTION]",
            parse=scoring_options,
        ),
    )
    max_request_tokens: int = field(
        default=DEFAULT_MAX_REQUEST_TOKENS,
        metadata=flag("--max-request-tokens", "the most tokens one request may use (default %(default)s)", type=int),
    )
    max_sequence_tokens: int = field(
        default=DEFAULT_MAX_SEQUENCE_TOKENS,
        metadata=flag(
            "--max-sequence-tokens",
            "the most tokens of the state plus its longest question and answer (default "
            "%(default)s; never more than the model's context)",
            type=int,
        ),
    )
    calibration: str | None = field(
        default="auto",
        metadata=flag(
            "--calibration",
            "auto (the temperatures fitted for this model, if any), a calibration file, or none",
            parse=lambda v: None if v == "none" else v,
        ),
    )
    facts: bool = field(
        default=True,
        metadata=flag(
            "--facts",
            "answer single numeric and date comparisons exactly, by parsing (default on)",
            choices=["on", "off"],
            parse=on_off,
        ),
    )
    readouts: tuple[tuple[str | None, str], ...] = field(
        default=(),
        metadata=flag(
            "--readout",
            "a trained readout (prefill train's folder or file), read instead of the log-likelihoods; "
            "serve: repeatable, each served as model NAME (default: base+folder) beside the plain base, all on one "
            "copy of the weights (a LoRA readout must be served alone)",
            action="append",
            metavar="[NAME=]DIR",
            parse=readout_options,
        ),
    )
    fallback_below: float | None = field(
        default=None,
        metadata=flag(
            "--fallback-below",
            "questions whose confidence, (p_max - 1/n)/(1 - 1/n), is under this are escalated "
            "(--fallback-url or --fallback-model) or listed in x_low_confidence",
            type=float,
        ),
    )
    student_below: float | None = field(
        default=None,
        metadata=flag(
            "--student-below",
            "a static student (--readout DIR from prefill distill --student static) hands a question to the base "
            "model when its confidence is under this (default: the threshold its distill run found for its target "
            "agreement; 0: never)",
            type=float,
        ),
    )
    fallback_url: str | None = field(
        default=None,
        metadata=flag(
            "--fallback-url",
            "a server for low-confidence questions: another System One server, or with "
            "--fallback-kind openai an OpenAI-compatible chat endpoint (its base URL)",
        ),
    )
    fallback_kind: str = field(
        default="systemone",
        metadata=flag("--fallback-kind", "what --fallback-url speaks", choices=["systemone", "openai"]),
    )
    fallback_model: str | None = field(
        default=None,
        metadata=flag(
            "--fallback-model",
            "with --fallback-url: the model name to ask there (System One default jev-latest; "
            "required for openai); without: a stronger local model loaded in this process",
        ),
    )
    fallback_key: str | None = field(
        default=None,
        metadata=flag(
            "--fallback-key",
            "Bearer key for --fallback-url (also PREFILL_FALLBACK_KEY)",
            parse=lambda v: v or os.environ.get("PREFILL_FALLBACK_KEY"),
        ),
    )
    fallback_timeout: float = field(
        default=10.0,
        metadata=flag(
            "--fallback-timeout",
            "seconds to wait for --fallback-url before keeping the local answer (default 10)",
            type=float,
        ),
    )

    def __post_init__(self) -> None:
        """The checks the command line makes, for settings built in Python (`Prefill(facts="off", ...)`), so a
        value the command line would refuse is refused here too, before the model loads, not ignored: the
        command-line forms of on/off switches and `calibration="none"` are read as there."""
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if meta["parse"] is on_off:
                if value in ("on", "off"):
                    object.__setattr__(self, f.name, on_off(value))
                elif not isinstance(value, bool):
                    raise ValueError(f"{f.name} is True or False (on/off on the command line), not {value!r}")
            elif meta["parse"] is auto_on_off:
                if value not in (None, True, False, "auto", "on", "off"):
                    raise ValueError(
                        f"{f.name} is None, True or False (auto/on/off on the command line), not {value!r}"
                    )
                object.__setattr__(self, f.name, auto_on_off(value))
            elif value is not None and value not in meta["argparse"].get("choices", (value,)):
                raise ValueError(f"{f.name} must be one of {', '.join(meta['argparse']['choices'])}, not {value!r}")
        if self.calibration == "none":
            object.__setattr__(self, "calibration", None)
        if self.scoring is not None:
            from .scoring import ways_asked

            ways_asked(self.scoring)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Every field as its flag (dest: the field's name)."""
        for f in dataclasses.fields(cls):
            meta = f.metadata
            kw = dict(meta["argparse"])
            if kw.get("action") == "append":
                kw["default"] = []
            elif kw.get("action") != "store_true":
                kw.setdefault("default", _flag_default(f))
            parser.add_argument(meta["flag"], dest=f.name, help=meta["help"], **kw)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        """The settings the parsed flags give; a value the field cannot take raises ValueError."""
        values = {}
        for f in dataclasses.fields(cls):
            raw = getattr(args, f.name)
            parse = f.metadata["parse"]
            values[f.name] = parse(raw) if parse else raw
        return cls(**values)

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)


def _flag_default(f: dataclasses.Field):
    """The flag's default as typed on a command line ("on"/"off" for a bool, "none" for no calibration)."""
    if f.metadata["parse"] is on_off:
        return "on" if f.default else "off"
    if f.metadata["parse"] is auto_on_off:
        return {None: "auto", True: "on", False: "off"}[f.default]
    return f.default
