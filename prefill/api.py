"""The Python API: as short as a Hugging Face pipeline for the same job.

    from prefill import Prefill, Noul, Choice, Score
    pf = Prefill()                                     # the embedded default model, offline
    pf.ask("I was charged twice!", Noul("Does the customer want money back?")).noul
    pf.ask(ticket, {"team": Choice("Which team?", ["Billing", "Technical"]),
                    "anger": Score("How angry?", ["Calm", "Annoyed", "Furious"])})
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any, overload

from . import loading
from .backends.causal_lm import CausalLMBackend
from .calibration import Calibration, shipped
from .engine import DEFAULT_MAX_REQUEST_TOKENS, Engine
from .readout import Readouts
from .schema import Answer, Choice, Noul, Score

QuestionT = Noul | Choice | Score


class Prefill:
    """A model, loaded once, that answers typed questions about a state in one prefill pass."""

    def __init__(self, model: str | None = None, *, dtype: str = "float32", chat: bool | None = None,
                 packing: str = "auto", max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
                 calibration: str | Path | None = "auto", facts: bool = True, readout: str | Path | None = None,
                 fallback_below: float | None = None, fallback: Engine | None = None):
        """`calibration`: "auto" applies the temperatures fitted for this model if prefill ships or has
        cached them (see `prefill calibrate`), a path applies that file (refused if fitted for another
        model), None serves the raw model probabilities. `facts`: answer single numeric and date
        comparisons exactly (see facts.py). `readout`: a trained readout (prefill train) for this model.
        `fallback_below`: questions less sure than this go to `fallback` (a stronger engine) if given,
        else are reported as low-confidence (Engine.decide)."""
        source = loading.resolve(model)
        hf_model, tokenizer = loading.load(source, dtype)
        self.backend = CausalLMBackend(hf_model, tokenizer, source.name, release_date=source.release_date,
                                       chat=chat, packing=packing, fingerprint=loading.fingerprint(source))
        self.engine = Engine(self.backend, max_request_tokens=max_request_tokens,
                             calibration=find_calibration(calibration, self.backend.fingerprint), use_facts=facts,
                             readouts=Readouts.load(readout, self.backend.fingerprint) if readout else None,
                             fallback_below=fallback_below, fallback=fallback)

    @classmethod
    def from_backend(cls, backend: Any, **engine_options: Any) -> Prefill:
        self = cls.__new__(cls)
        self.backend = backend
        self.engine = Engine(backend, **engine_options)
        return self

    @property
    def name(self) -> str:
        return self.engine.name

    @overload
    def ask(self, state: Any, questions: QuestionT) -> Answer: ...
    @overload
    def ask(self, state: Any, questions: Mapping[str, QuestionT]) -> dict[str, Answer]: ...

    def ask(self, state, questions, reference_date: dt.date | None = None):
        """Answers for a mapping of id → question, or the one answer for a single question.
        `reference_date`: "today" for date questions (else the date the state gives, if any)."""
        if isinstance(questions, (Noul, Choice, Score)):
            return self.engine.ask(state, {"q": questions}, reference_date)[0]["q"]
        return self.engine.ask(state, questions, reference_date)[0]


def find_calibration(choice: str | Path | None, fingerprint: str) -> Calibration | None:
    if choice is None:
        return None
    if choice == "auto":
        cached = loading.cache_dir() / "calibration" / f"{fingerprint[:16]}.json"
        path = cached if cached.is_file() else shipped(fingerprint)
        return Calibration.load(path, fingerprint) if path else None
    return Calibration.load(choice, fingerprint)
