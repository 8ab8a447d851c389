"""The Python API: as short as a Hugging Face pipeline for the same job.

from prefill import Prefill, Noul, Choice, Score
pf = Prefill()                                     # the embedded default model, offline
pf.ask("I was charged twice!", Noul("Does the customer want money back?")).noul
pf.ask(ticket, {"team": Choice("Which team?", ["Billing", "Technical"]),
                "anger": Score("How angry?", ["Calm", "Annoyed", "Furious"])})
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, overload

from . import build
from .backends.base import ReadoutUnsupported, RequestTooLarge
from .engine import Engine
from .schema import Answer, AnyQuestion, Choice, Noul, Score, wire_questions
from .scoring import PriorCache
from .settings import Settings
from .static import is_static

# What `Prefill.warm_up` asks: a made-up message and a question of each type.
WARM_UP_STATE = "Hello, my order #1234 arrived two days late and the box was damaged. Can you help me?"
WARM_UP_QUESTIONS = {
    "noul": Noul("Is the customer asking for help?"),
    "choice": Choice("Which team should handle this message?", ["Billing", "Shipping", "Support"]),
    "score": Score("How upset is the customer?", ["Calm", "Upset", "Angry"]),
}


class Prefill:
    """A model, loaded once, that answers typed questions about a state in one prefill pass."""

    def __init__(
        self,
        model: str | None = None,
        *,
        readout: str | Path | None = None,
        fallback: Any = None,
        settings: Settings | None = None,
        plan: build.Plan | None = None,
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
        the raw model probabilities. `plan`: what `build.plan(settings)` decided already (prefill serve
        announces it before loading), not decided twice."""
        if settings is None:
            settings = Settings(model=model, readouts=((None, str(readout)),) if readout else (), **options)
        self.settings = settings
        self.plan = plan or build.plan(settings)
        self.backend = build.backend(settings, self.plan)
        self.dtype = self.backend.precision  # auto's int8 falls back to fp32 on the encoder route and vLLM
        first = settings.readouts[0][1] if settings.readouts else None
        static = first is not None and is_static(first)
        heads = build.readout(self.backend, first) if first is not None and not static else None
        chosen = fallback if fallback is not None else build.fallback(settings)
        self.engine = build.engine(settings, self.backend, heads, chosen)
        self.engines: dict[str, Engine] = {self.engine.name: self.engine}
        if static:  # the static student answers first, the base model (its fallback and all) after it
            self.engine = self.add_readout(first, settings.readouts[0][0])

    def add_readout(self, path: str | Path, name: str | None = None) -> Engine:
        """Another trained readout served beside the others, on this one copy of the base weights and its
        state cache (the heads are small; only they are loaded). Served as `name` (default: base+folder).
        A readout trained with a LoRA changes the base's weights, so it cannot share them: load it alone
        (`Prefill(readout=...)`). A static student (`prefill distill --student static`) is served in front of the
        base model: what it was not taught, or is unsure of, goes on to it."""
        if is_static(path):
            base = next(e for e in self.engines.values() if isinstance(e, Engine) and e.heads is None)
            engine = build.static_engine(getattr(self, "settings", None) or Settings(), path, base, name)
            if engine.name in self.engines:
                raise ValueError(f"two served models would be named {engine.name!r}; name them (--readout NAME=DIR)")
            self.engines[engine.name] = engine
            return engine
        heads = build.readout(self.backend, path)
        build.check_shared(
            [e.heads is not None and e.heads.adapter is not None for e in self.engines.values()]
            + [heads.adapter is not None]
        )
        # the base's engine (limits, fact pass, fallback) reading the head; the base's calibration is not the head's
        engine = dataclasses.replace(self.engine, heads=heads, served_as=name, calibration=None, _priors=PriorCache())
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
        after this, which itself took 1.7 s (medians of five fresh processes each;
        docs/measurements/serving-under-load.md#a-processs-first-request, `python -m benchmarks.speed.first_request`).
        `prefill serve` calls it before it says it is ready, so the first user does not pay them. The fallback is never
        asked (`Engine.probabilities`); the made-up state and questions stay in the caches as any request's would, and
        answer nothing else."""
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
