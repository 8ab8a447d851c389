"""The Python API: as short as a Hugging Face pipeline for the same job.

from prefill import Prefill, Noul, Choice, Score
pf = Prefill()                                     # the embedded default model, offline
pf.ask("I was charged twice!", Noul("Does the customer want money back?")).noul
pf.ask(ticket, {"team": Choice("Which team?", ["Billing", "Technical"]),
                "anger": Score("How angry?", ["Calm", "Annoyed", "Furious"])})
"""

from __future__ import annotations

import datetime as dt
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, overload

from . import loading
from .backends.base import ReadoutUnsupported, RequestTooLarge
from .backends.cpu import resolve_dtype
from .backends.factory import build_backend
from .backends.vllm_lm import NO_READOUTS
from .engine import Engine
from .evaluation.calibration import Calibration, shipped
from .heads.head import Heads
from .schema import Answer, AnyQuestion, Choice, Noul, Score, wire_questions
from .scoring import DEFAULT as DEFAULT_SCORING
from .scoring import Scoring, ways_asked
from .settings import Settings

# What `Prefill.warm_up` asks: a made-up message and a question of each type.
WARM_UP_STATE = "Hello, my order #1234 arrived two days late and the box was damaged. Can you help me?"
WARM_UP_QUESTIONS = {
    "noul": Noul("Is the customer asking for help?"),
    "choice": Choice("Which team should handle this message?", ["Billing", "Shipping", "Support"]),
    "score": Score("How upset is the customer?", ["Calm", "Upset", "Angry"]),
}

LORA_CANNOT_SHARE = (
    "a readout trained with a LoRA adapter changes the base model's weights, so it cannot share "
    "them with other readouts or the plain base: serve it alone, one process per LoRA readout"
)


class Prefill:
    """A model, loaded once, that answers typed questions about a state in one prefill pass."""

    def __init__(
        self,
        model: str | None = None,
        *,
        readout: str | Path | None = None,
        fallback: Any = None,
        settings: Settings | None = None,
        **options: Any,
    ):
        """`Prefill(model, dtype=..., scoring=..., ...)`: any field of `Settings` (settings.py, where each is
        documented with its command-line flag) as a keyword, or `settings=` a whole `Settings`.
        `readout`: a trained readout (prefill train) for this model; more on the same weights: `add_readout`,
        and `engines` has them all by served name. `fallback`: an engine or a remote server (fallback.remote)
        for questions less sure than `fallback_below` (default: the one the settings' fallback_* describe;
        none: they are reported as low-confidence, Engine.decide). `calibration`: "auto" applies the
        temperatures fitted for this model if prefill ships or has cached them (`prefill calibrate`), a path
        applies that file (refused if fitted for another model or another prompt or scoring), None serves
        the raw model probabilities."""
        if settings is None:
            settings = Settings(model=model, readouts=((None, str(readout)),) if readout else (), **options)
        self.settings = settings
        self.backend = build_backend(settings, resolve_dtype(settings.dtype))
        self.dtype = self.backend.precision  # auto's int8 falls back to fp32 on the encoder route and vLLM
        heads = None
        if settings.readouts:
            path = settings.readouts[0][1]
            heads = Heads.load(path, self.backend.readout_fingerprint)
            if not _can_read(self.backend, heads):
                raise ReadoutUnsupported(f"{path}: an early-exit head or a LoRA adapter needs the decoder route")
        ways = scoring_for(self.backend, settings.scoring)
        self.engine = Engine(
            self.backend,
            max_request_tokens=settings.max_request_tokens,
            max_sequence_tokens=settings.max_sequence_tokens,
            scoring=ways,
            calibration=find_calibration(
                settings.calibration, self.backend.fingerprint, setup(self.backend.renderer, ways)
            ),
            use_facts=settings.facts,
            heads=heads,
            fallback_below=settings.fallback_below,
            fallback=fallback if fallback is not None else build_fallback(settings),
        )
        self.engines: dict[str, Engine] = {self.engine.name: self.engine}

    def add_readout(self, path: str | Path, name: str | None = None) -> Engine:
        """Another trained readout served beside the others, on this one copy of the base weights and its
        state cache (the heads are small; only they are loaded). Served as `name` (default: base+folder).
        A readout trained with a LoRA changes the base's weights, so it cannot share them: load it alone
        (`Prefill(readout=...)`)."""
        if not self.backend.reads_features:
            raise ReadoutUnsupported(NO_READOUTS)
        heads = Heads.load(path, self.backend.readout_fingerprint)
        if not _can_read(self.backend, heads):
            raise ReadoutUnsupported(f"{path}: an early-exit head or a LoRA adapter needs the decoder route")
        if heads.adapter is not None or self.engine.heads is not None and self.engine.heads.adapter is not None:
            raise ValueError(f"{path}: {LORA_CANNOT_SHARE}")
        base = self.engine
        engine = Engine(
            self.backend,
            max_request_tokens=base.max_request_tokens,
            max_sequence_tokens=base.max_sequence_tokens,
            use_facts=base.use_facts,
            heads=heads,
            fallback_below=base.fallback_below,
            fallback=base.fallback,
            served_as=name,
        )
        if engine.name in self.engines:
            raise ValueError(f"two served models would be named {engine.name!r}; name them (--readout NAME=DIR)")
        self.engines[engine.name] = engine
        return engine

    @classmethod
    def from_backend(cls, backend: Any, **engine_options: Any) -> Prefill:
        self = cls.__new__(cls)
        self.backend = backend
        self.engine = Engine(backend, **engine_options)
        self.engines = {self.engine.name: self.engine}
        return self

    @property
    def name(self) -> str:
        return self.engine.name

    @overload
    def ask(self, state: Any, questions: AnyQuestion) -> Answer: ...
    @overload
    def ask(self, state: Any, questions: Mapping[str, AnyQuestion]) -> dict[str, Answer]: ...

    def warm_up(self) -> float:
        """Ask one made-up request of each question type through every served engine, and return the
        seconds it took. A process's first request pays one-time costs that later ones do not (the matrix
        library's kernels built for the shapes it meets, memory touched for the first time, the priors'
        empty state run): on the 1.5B in bf16, a fresh process's first request took 1.67 s, and 1.34 s
        after this, which itself took 1.7 s (medians of five fresh processes each; README "A process's
        first request", `python -m benchmarks.first_request`). `prefill serve` calls it before it says it
        is ready, so the first user does not pay them. The fallback is never asked (`Engine.probabilities`);
        the made-up state and questions stay in the caches as any request's would, and answer nothing else."""
        started = time.perf_counter()
        for engine in self.engines.values():
            try:
                engine.probabilities(WARM_UP_STATE, WARM_UP_QUESTIONS)
            except (ReadoutUnsupported, RequestTooLarge):  # what a request would be refused for, not a fault
                pass
        return time.perf_counter() - started

    def ask(self, state, questions, reference_date: dt.date | None = None):
        """Answers for a mapping of id → question, or the one answer for a single question. A question in
        the mapping may be an object or its wire form (`{"type": "noul", "instructions": ...}`, as a
        request or `--questions` has it). `reference_date`: "today" for date questions (else the date the
        state gives, if any)."""
        if isinstance(questions, (Noul, Choice, Score)):
            return self.engine.ask(state, {"q": questions}, reference_date)[0]["q"]
        return self.engine.ask(state, as_questions(questions), reference_date)[0]


def as_questions(questions: Any) -> dict[str, AnyQuestion]:
    """{id: question} from what `Prefill.ask` takes: question objects, or their wire form, validated by the
    request's rules; anything else is a TypeError that says what is taken."""
    if not isinstance(questions, Mapping):
        raise TypeError(
            "questions: a Noul, Choice or Score, or a mapping of id -> question (an object or its wire form), "
            f"not {type(questions).__name__}"
        )
    wire = {qid: q for qid, q in questions.items() if not isinstance(q, (Noul, Choice, Score))}
    return {**questions, **wire_questions(wire)} if wire else dict(questions)


def scoring_for(backend, asked: Mapping[str, str | Scoring] | None) -> dict[str, Scoring]:
    """The training-free scoring per question type: the defaults (scoring.py), those asked over them. The
    encoder route scores its slots as they are (whole options; no prior unless a correction is asked)."""
    asked_ways = ways_asked(asked)
    if backend.route == "encoder":
        if any(w.tokens != "whole" for w in asked_ways.values()):
            raise ValueError("the encoder route scores whole options: only a correction can be chosen (whole+pmi)")
        return {**dict.fromkeys(("noul", "choice", "score"), Scoring("whole")), **asked_ways}
    return {**DEFAULT_SCORING, **asked_ways}


def build_fallback(settings: Settings):
    """The fallback the settings describe: a remote server (--fallback-url), a stronger local model
    (--fallback-model alone), or none."""
    if settings.fallback_url:
        from .fallback import remote

        return remote(
            settings.fallback_url,
            settings.fallback_kind,
            model=settings.fallback_model,
            api_key=settings.fallback_key,
            timeout=settings.fallback_timeout,
        )
    if settings.fallback_model:
        return Prefill(
            settings.fallback_model,
            dtype=settings.dtype,
            max_request_tokens=settings.max_request_tokens,
            facts=settings.facts,
        ).engine
    return None


def _can_read(backend, heads: Heads) -> bool:
    """Whether the backend gives what the heads read: hidden states (no vLLM), and for an early-exit head
    or a LoRA adapter the decoder's layer-by-layer pass."""
    if not backend.reads_features:
        return False
    return (heads.early is None or backend.exits_early) and (heads.adapter is None or backend.merges_adapters)


def setup(renderer, scoring: Mapping[str, Scoring]) -> dict[str, str]:
    """What a calibration's temperatures depend on besides the weights: the prompt and the scoring."""
    return {
        "prompt": f"{'chat' if renderer.chat else 'plain'}{'' if renderer.system else '-nosystem'}"
        f"-{renderer.noul_words}{'-levelnames' if renderer.score_words == 'names' else ''}"
        f"{'-numberedoptions' if renderer.choice_words == 'numbers' else ''}",
        **{t: str(w) for t, w in sorted(scoring.items())},
    }


def check_calibration(choice: str | Path | None) -> None:
    """A calibration file that is not there, said before anything loads."""
    if choice not in (None, "auto") and not Path(choice).is_file():
        raise ValueError(f"calibration {choice}: no such file (a file prefill calibrate wrote, auto or none)")


def find_calibration(
    choice: str | Path | None, fingerprint: str, used: dict[str, str] | None = None
) -> Calibration | None:
    """`used`: this engine's setup(); a calibration fitted under another one is skipped ("auto": the
    temperatures would be wrong for these scores) or refused (a file the caller named)."""
    if choice is None:
        return None
    if choice == "auto":
        cached = loading.cache_dir() / "calibration" / f"{fingerprint[:16]}.json"
        path = cached if cached.is_file() else shipped(fingerprint)
        cal = Calibration.load(path, fingerprint) if path else None
        if cal is not None and used is not None and not cal.fits(used):
            fitted = cal.setup or "the whole-sequence readout of earlier versions"
            warnings.warn(
                f"not applying {path}: it was fitted with {fitted}, not this engine's {used}; "
                "refit it with `prefill calibrate`",
                stacklevel=2,
            )
            return None
        return cal
    check_calibration(choice)
    cal = Calibration.load(choice, fingerprint)
    if used is not None and not cal.fits(used):
        raise ValueError(f"{choice} was fitted with {cal.setup}, not this engine's {used}")
    return cal
