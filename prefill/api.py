"""The Python API: as short as a Hugging Face pipeline for the same job.

    from prefill import Prefill, Noul, Choice, Score
    pf = Prefill()                                     # the embedded default model, offline
    pf.ask("I was charged twice!", Noul("Does the customer want money back?")).noul
    pf.ask(ticket, {"team": Choice("Which team?", ["Billing", "Technical"]),
                    "anger": Score("How angry?", ["Calm", "Annoyed", "Furious"])})
"""
from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, overload

import torch

from . import loading
from .backends.base import ReadoutUnsupported
from .backends.causal_lm import CausalLMBackend
from .backends.cpu import resolve_dtype
from .backends.vllm_lm import NO_READOUTS
from .calibration import Calibration, shipped
from .engine import DEFAULT_MAX_REQUEST_TOKENS, DEFAULT_MAX_SEQUENCE_TOKENS, Engine
from .readout import Readouts
from .render import DEFAULT_NOUL_WORDS, DEFAULT_SCORE_WORDS, DEFAULT_SYSTEM
from .schema import Answer, Choice, Noul, Score
from .scoring import DEFAULT as DEFAULT_SCORING
from .scoring import Scoring

QuestionT = Noul | Choice | Score
LORA_CANNOT_SHARE = ("a readout trained with a LoRA adapter changes the base model's weights, so it cannot share "
                     "them with other readouts or the plain base: serve it alone, one process per LoRA readout")


class Prefill:
    """A model, loaded once, that answers typed questions about a state in one prefill pass."""

    def __init__(self, model: str | None = None, *, dtype: str | None = None, chat: bool | None = None,
                 system: bool = DEFAULT_SYSTEM, noul_words: str = DEFAULT_NOUL_WORDS,
                 score_words: str = DEFAULT_SCORE_WORDS, scoring: Mapping[str, str | Scoring] | None = None,
                 packing: str = "auto", max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
                 max_sequence_tokens: int = DEFAULT_MAX_SEQUENCE_TOKENS,
                 calibration: str | Path | None = "auto", facts: bool = True, readout: str | Path | None = None,
                 fallback_below: float | None = None, fallback: Any = None, backend: str = "torch",
                 route: str = "auto"):
        """`calibration`: "auto" applies the temperatures fitted for this model if prefill ships or has
        cached them (see `prefill calibrate`), a path applies that file (refused if fitted for another
        model), None serves the raw model probabilities; a calibration fitted under another prompt or
        scoring is not applied ("auto", with a warning) or refused (a path). `system`, `noul_words`,
        `score_words`, `scoring`: the prompt and the training-free readout (render.py, scoring.py; the
        defaults were chosen on real labelled text, README "Real text"). `facts`: answer single numeric and
        date comparisons exactly (see facts.py). `readout`: a trained readout (prefill train) for this model.
        `fallback_below`: questions less sure than this go to `fallback` (a stronger engine, or a remote
        server: fallback.remote) if given, else are reported as low-confidence (Engine.decide).
        More readouts on the same weights: `add_readout`; `engines` has them all by served name.
        `backend`: "torch" (the tree engine, the reference) or "vllm" (backends/vllm_lm.py; same answers,
        no trained readouts). `route`: "decoder" (a causal LM), "encoder" (a bidirectional encoder with a
        [MASK] slot per option: backends/encoder.py) or "auto" (by the model's type)."""
        self.dtype = dtype = resolve_dtype(dtype)
        source = loading.resolve(model, dtype)
        prompt = dict(chat=chat, system=system, noul_words=noul_words, score_words=score_words)
        if route not in ("auto", "decoder", "encoder"):
            raise ValueError(f"route must be auto, decoder or encoder, not {route!r}")
        encoder = route == "encoder" or route == "auto" and loading.is_encoder(source)
        if encoder:
            if backend != "torch":
                raise ValueError("the encoder route runs on the torch backend only")
            from transformers import AutoModel, AutoTokenizer

            from .backends.encoder import EncoderBackend
            directory = loading.model_directory(source)
            self.backend = EncoderBackend(AutoModel.from_pretrained(directory, dtype=getattr(torch, dtype)),
                                          AutoTokenizer.from_pretrained(directory), source.name,
                                          release_date=source.release_date, fingerprint=loading.fingerprint(source))
            # The slot scores as they are (no prior, unless a correction is asked for); options are whole here.
            asked = {t: w if isinstance(w, Scoring) else Scoring.parse(w) for t, w in (scoring or {}).items()}
            if any(w.readout != "whole" for w in asked.values()):
                raise ValueError("the encoder route scores whole options: only a correction can be chosen (whole+pmi)")
            scoring = {**dict.fromkeys(("noul", "choice", "score"), Scoring("whole")), **asked}
        elif backend == "vllm":
            if readout:
                raise ReadoutUnsupported(NO_READOUTS)
            from transformers import AutoTokenizer

            from .backends.vllm_lm import VLLMBackend
            directory = loading.model_directory(source)
            self.backend = VLLMBackend(directory, AutoTokenizer.from_pretrained(directory), source.name, dtype=dtype,
                                       release_date=source.release_date, fingerprint=loading.fingerprint(source),
                                       **prompt)
        elif backend == "torch":
            hf_model, tokenizer = loading.load(source, dtype)
            self.backend = CausalLMBackend(hf_model, tokenizer, source.name, release_date=source.release_date,
                                           packing=packing, fingerprint=loading.fingerprint(source), **prompt)
        else:
            raise ValueError(f"backend must be torch or vllm, not {backend!r}")
        heads = Readouts.load(readout, self.backend.fingerprint) if readout else None
        if heads is not None and not _can_read(self.backend, heads):
            raise ReadoutUnsupported(f"{readout}: an early-exit head or a LoRA adapter needs the decoder route")
        ways = {**DEFAULT_SCORING, **{t: w if isinstance(w, Scoring) else Scoring.parse(w)
                                      for t, w in (scoring or {}).items()}}
        self.engine = Engine(self.backend, max_request_tokens=max_request_tokens,
                             max_sequence_tokens=max_sequence_tokens, scoring=ways,
                             calibration=find_calibration(calibration, self.backend.fingerprint,
                                                          setup(self.backend.renderer, ways)), use_facts=facts,
                             readouts=heads,
                             fallback_below=fallback_below, fallback=fallback)
        self.engines: dict[str, Engine] = {self.engine.name: self.engine}

    def add_readout(self, path: str | Path, name: str | None = None) -> Engine:
        """Another trained readout served beside the others, on this one copy of the base weights and its
        state cache (the heads are small; only they are loaded). Served as `name` (default: base+folder).
        A readout trained with a LoRA changes the base's weights, so it cannot share them: load it alone
        (`Prefill(readout=...)`)."""
        if not hasattr(self.backend, "features"):
            raise ReadoutUnsupported(NO_READOUTS)
        heads = Readouts.load(path, self.backend.fingerprint)
        if not _can_read(self.backend, heads):
            raise ReadoutUnsupported(f"{path}: an early-exit head or a LoRA adapter needs the decoder route")
        if heads.adapter is not None or self.engine.readouts is not None and self.engine.readouts.adapter is not None:
            raise ValueError(f"{path}: {LORA_CANNOT_SHARE}")
        base = self.engine
        engine = Engine(self.backend, max_request_tokens=base.max_request_tokens,
                        max_sequence_tokens=base.max_sequence_tokens, use_facts=base.use_facts,
                        readouts=heads, fallback_below=base.fallback_below, fallback=base.fallback,
                        served_as=name)
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
    def ask(self, state: Any, questions: QuestionT) -> Answer: ...
    @overload
    def ask(self, state: Any, questions: Mapping[str, QuestionT]) -> dict[str, Answer]: ...

    def ask(self, state, questions, reference_date: dt.date | None = None):
        """Answers for a mapping of id → question, or the one answer for a single question.
        `reference_date`: "today" for date questions (else the date the state gives, if any)."""
        if isinstance(questions, (Noul, Choice, Score)):
            return self.engine.ask(state, {"q": questions}, reference_date)[0]["q"]
        return self.engine.ask(state, questions, reference_date)[0]


def _can_read(backend, heads: Readouts) -> bool:
    """Whether the backend gives what the heads read: hidden states (no vLLM), and for an early-exit head
    or a LoRA adapter the decoder's layer-by-layer pass."""
    if not hasattr(backend, "features"):
        return False
    return (heads.early is None or hasattr(backend, "features_early_exit")) and (
        heads.adapter is None or hasattr(backend, "merge_adapter"))


def setup(renderer, scoring: Mapping[str, Scoring]) -> dict[str, str]:
    """What a calibration's temperatures depend on besides the weights: the prompt and the scoring."""
    return {"prompt": f"{'chat' if renderer.chat else 'plain'}{'' if renderer.system else '-nosystem'}"
                      f"-{renderer.noul_words}{'-levelnames' if renderer.score_words == 'names' else ''}",
            **{t: str(w) for t, w in sorted(scoring.items())}}


def find_calibration(choice: str | Path | None, fingerprint: str, used: dict[str, str] | None = None) -> Calibration | None:
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
            warnings.warn(f"not applying {path}: it was fitted with {fitted}, not this engine's {used}; "
                          "refit it with `prefill calibrate`", stacklevel=2)
            return None
        return cal
    cal = Calibration.load(choice, fingerprint)
    if used is not None and not cal.fits(used):
        raise ValueError(f"{choice} was fitted with {cal.setup}, not this engine's {used}")
    return cal
