"""The engine: typed questions in, probability distributions over exactly the declared answers out.

It renders the request to a token tree, asks the backend for each answer's log-likelihood in one pass,
and turns those into the wire answers: a softmax over the declared answers only (so an undeclared
answer cannot come out), the expectation for scores, and confidence exactly as TypeSafe defines it.
Questions that are one numeric or date comparison are first offered to the fact pass (facts.py), which
answers them exactly when it can tell what to compare; only the rest reach the model.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import facts
from .backends.base import Backend
from .calibration import Calibration
from .readout import Readouts
from .render import Branches, render_text
from .scoring import DEFAULT as DEFAULT_SCORING
from .scoring import PriorCache, Scoring, corrected
from .schema import Answer, Choice, ChoiceAnswer, Noul, NoulAnswer, Score, ScoreAnswer, Usage

DEFAULT_MAX_REQUEST_TOKENS = 262_144
log = logging.getLogger("prefill.engine")
_BACKEND_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def backend_lock(backend: Backend) -> threading.Lock:
    """One lock per backend, shared by every engine on it (several readouts served on one copy of the
    weights): a backend runs one forward at a time and its state cache is not thread-safe."""
    try:
        return _BACKEND_LOCKS.setdefault(backend, threading.Lock())
    except TypeError:  # an unhashable or non-weakref-able backend (test doubles): its own lock
        return threading.Lock()


class RequestTooLarge(ValueError):
    """The request needs more tokens than a configured or model limit allows."""


@dataclass
class Decision:
    """Everything the engine decided for one request; `ask` returns the wire part (answers, usage)."""
    answers: dict[str, Answer]
    usage: Usage
    low_confidence: list[str] = field(default_factory=list)  # under the fallback threshold, not escalated
    escalated: list[str] = field(default_factory=list)       # answered by the fallback engine instead
    early_exit: list[str] = field(default_factory=list)      # answered by the shallow readout head


@dataclass
class Engine:
    backend: Backend
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    # Fitted temperatures (prefill calibrate), applied to every answer; None serves raw model probabilities.
    calibration: Calibration | None = None
    # Exact answers for single numeric/date comparisons (see facts.py and the README's measurement).
    use_facts: bool = True
    # Trained heads (prefill train) read instead of the training-free log-likelihoods; they carry their own
    # calibration (per-type temperatures fitted on families they did not train on), so `calibration`, which
    # is the base model's, is not applied to them.
    readouts: Readouts | None = None
    # Questions whose confidence (p_max - 1/n)/(1 - 1/n), comparable across option counts, is under
    # `fallback_below` are re-asked to `fallback` if there is one (a stronger engine, or a remote server:
    # fallback.py), else reported. What the fallback cannot answer keeps its local answer and is reported.
    fallback_below: float | None = None
    fallback: Any = None
    # The served model name, when it is not the base model's (+ the readout's): `prefill serve --readout NAME=DIR`.
    served_as: str | None = None
    # How the training-free path turns token log-probabilities into answer scores, per question type
    # (scoring.py: readout and correction; the default was chosen on real labelled text).
    scoring: Mapping[str, Scoring] = field(default_factory=lambda: dict(DEFAULT_SCORING))
    _priors: PriorCache = field(default_factory=PriorCache, repr=False)
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lock = backend_lock(self.backend)
        # A readout trained with a LoRA reads the adapted model: merge it wherever a readout meets its backend.
        if self.readouts is not None and self.readouts.adapter is not None:
            self.backend.merge_adapter(self.readouts.adapter)

    @property
    def name(self) -> str:
        """The served model name: the base model's, plus the readout's when one is loaded (or `served_as`)."""
        if self.served_as:
            return self.served_as
        return self.backend.name + (f"+{self.readouts.name}" if self.readouts else "")

    @property
    def description(self) -> str:
        if not self.readouts:
            return self.backend.description
        return f"{self.backend.description}, with the trained readout {self.readouts.name!r}"

    def ask(self, state: Any, questions: Mapping[str, Noul | Choice | Score],
            reference_date: dt.date | None = None) -> tuple[dict[str, Answer], Usage]:
        """Answers for every question. `reference_date` is "today" for date questions; without it the fact
        pass uses the date the state gives ("Today is ..."), if any."""
        d = self.decide(state, questions, reference_date)
        return d.answers, d.usage

    def decide(self, state: Any, questions: Mapping[str, Noul | Choice | Score],
               reference_date: dt.date | None = None) -> Decision:
        probs, n_tokens, early = self.probabilities(state, questions, reference_date)
        low, escalated = [], []
        if self.fallback_below is not None:
            low = [qid for qid, p in probs.items() if choice_confidence(p) < self.fallback_below]
        if low and self.fallback is not None:
            try:
                more, extra_tokens, _ = self.fallback.probabilities(state, {q: questions[q] for q in low},
                                                                    reference_date)
            except Exception as e:  # noqa: BLE001 — a fallback never fails the request: local answers stay
                log.warning("fallback failed, keeping the local answers: %s: %s", type(e).__name__, e)
                more, extra_tokens = {}, 0
            probs.update(more)
            n_tokens += extra_tokens
            low, escalated = [q for q in low if q not in more], [q for q in low if q in more]
        answers = {qid: self._answer(q, probs[qid]) for qid, q in questions.items()}
        return Decision(answers, Usage(input_tokens=n_tokens, output_tokens=0), low, escalated, early)

    def probabilities(self, state: Any, questions: Mapping[str, Noul | Choice | Score],
                      reference_date: dt.date | None = None) -> tuple[dict[str, list[float]], int, list[str]]:
        """Each question's distribution over its declared answers (in declared order, noul: yes, no), the
        tokens the model read, and the questions a shallow readout answered."""
        probs: dict[str, list[float]] = {}
        if self.use_facts:
            state_text = render_text(state)
            for qid, q in questions.items():
                exact = facts.decide(state_text, q, reference_date)
                if exact is not None:
                    probs[qid] = exact
        asked = {qid: q for qid, q in questions.items() if qid not in probs}
        if not asked:
            return probs, 0, []
        renderer = self.backend.renderer
        state_ids = renderer.state(state)
        unique: dict[Branches, int] = {}    # identical questions are scored once, and so answered alike
        slot, qtypes = {}, []
        for qid, q in asked.items():
            slot[qid] = unique.setdefault(renderer.question(q), len(unique))
            if slot[qid] == len(qtypes):
                qtypes.append(q.type)
        branches = list(unique)
        n_tokens = self._check_limits(state_ids, branches)
        with self._lock:  # one forward at a time; concurrent requests queue here
            if self.readouts is None:
                per_branch = [self._calibrated(t, s) for t, s in zip(qtypes, self.scores(state_ids, branches, qtypes))]
                exited: set[int] = set()
            else:
                per_branch, exited = self._read_heads(state_ids, branches, qtypes)
        probs.update({qid: per_branch[slot[qid]] for qid in asked})
        return probs, n_tokens, [qid for qid in asked if slot[qid] in exited]

    def scores(self, state_ids: Sequence[int], branches: Sequence[Branches], qtypes: Sequence[str]) -> list[list[float]]:
        """Training-free answer scores: each question's readout over one packed pass, then its correction
        (a content-free prior per distinct question, cached). Before calibration."""
        ways = [self.scoring.get(t) or Scoring() for t in qtypes]
        cut = [w.branches(b) for w, b in zip(ways, branches)]
        out = [w.combine(c, s) for w, c, s in zip(ways, cut, self.backend.score(state_ids, cut))]
        renderer = self.backend.renderer
        for way in {w for w in ways if w.correction != "none"}:
            idx = [i for i, w in enumerate(ways) if w == way]
            priors = self._priors.log_priors(way, [cut[i] for i in idx],
                                             lambda text, bs: self.backend.score(renderer.state(text), bs))
            for i, prior in zip(idx, priors):
                out[i] = corrected(out[i], prior)
        return out

    def _calibrated(self, qtype: str, loglik: Sequence[float]) -> list[float]:
        return softmax(self.calibration.adjust(qtype, loglik) if self.calibration else loglik)

    def _read_heads(self, state_ids: Sequence[int], branches: Sequence[Branches],
                    qtypes: Sequence[str]) -> tuple[list[list[float]], set[int]]:
        """Trained heads. With a shallow head, the questions first run through its layers only; those it is
        sure of stop there, the others continue through the remaining layers to the final head."""
        heads = self.readouts
        final = heads.final
        if heads.early is None:
            feats = self.backend.features(state_ids, branches, [final.cfg.layer])
            return [self._head_probs(final, t, f) for t, f in zip(qtypes, feats)], set()
        early, shallow = heads.early, {}

        def exits(i: int, f) -> bool:
            shallow[i] = self._head_probs(early, qtypes[i], f)
            return choice_confidence(shallow[i]) >= early.cfg.exit_threshold

        pairs = self.backend.features_early_exit(state_ids, branches, early.cfg.layer, final.cfg.layer, exits)
        out = [shallow[i] if deep is None else self._head_probs(final, qtypes[i], deep)
               for i, (_, deep) in enumerate(pairs)]
        return out, {i for i, (_, deep) in enumerate(pairs) if deep is None}

    @staticmethod
    def _head_probs(head, qtype: str, f) -> list[float]:
        return softmax(head.score(qtype, f.decision[0], f.options[:, 0], f.loglik))

    def _check_limits(self, state: Sequence[int], branches: Sequence[Branches]) -> int:
        longest = max(len(b.prompt) + max(len(a) for a in b.answers) for b in branches)
        context = self.backend.max_context
        if len(state) + longest > context:
            raise RequestTooLarge(f"the state and its longest question need {len(state) + longest} tokens; "
                                  f"the model's context limit is {context} tokens")
        total = len(state) + sum(b.n_tokens for b in branches)
        if total > self.max_request_tokens:
            raise RequestTooLarge(f"the request needs {total} tokens; the limit is {self.max_request_tokens} "
                                  "tokens per request (--max-request-tokens)")
        return total

    def _answer(self, q: Noul | Choice | Score, probs: Sequence[float]) -> Answer:
        if isinstance(q, Noul):
            return NoulAnswer(noul=probs[0])
        if isinstance(q, Choice):
            names = list(q.criteria)
            # Exact ties go to the name that sorts first, whatever the request's option order.
            best = min(range(len(names)), key=lambda i: (-probs[i], names[i]))
            return ChoiceAnswer(choice=names[best], probabilities=dict(zip(names, probs)),
                                confidence=choice_confidence(probs))
        return ScoreAnswer(score=sum(i * p for i, p in enumerate(probs)),
                           legend={str(i): level for i, level in enumerate(q.criteria)},
                           probabilities={str(i): p for i, p in enumerate(probs)},
                           confidence=score_confidence(probs))


def softmax(logits: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Softmax over the declared answers. Answers the model finds impossible (-inf) get 0; if every
    answer is impossible the distribution is uniform rather than NaN."""
    finite = [x / temperature for x in logits if math.isfinite(x)]
    if not finite:
        return [1.0 / len(logits)] * len(logits)
    top = max(finite)
    exps = [math.exp(x / temperature - top) if math.isfinite(x) else 0.0 for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def choice_confidence(probs: Sequence[float]) -> float:
    """TypeSafe's choice confidence: how far the top probability is from uniform, (p_max - 1/n)/(1 - 1/n)."""
    n = len(probs)
    return min(1.0, max(0.0, (max(probs) - 1 / n) / (1 - 1 / n)))


def score_confidence(probs: Sequence[float]) -> float:
    """TypeSafe's score confidence: 1 - (expected distance from the mode) / D, floored at 0, where D is
    that distance under a uniform distribution, the mean |i - (n-1)/2| over the n levels."""
    n = len(probs)
    mode = max(range(n), key=lambda i: probs[i])
    spread = sum(p * abs(i - mode) for i, p in enumerate(probs))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1 - spread / uniform))
