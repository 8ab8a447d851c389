"""The engine: typed questions in, probability distributions over exactly the declared answers out.

It renders the request to a token tree, asks the backend for each answer's log-likelihood in one pass,
and turns those into the wire answers: a softmax over the declared answers only (so an undeclared
answer cannot come out), the expectation for scores, and confidence exactly as TypeSafe defines it.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .backends.base import Backend
from .calibration import Calibration
from .render import Branches
from .schema import Answer, Choice, ChoiceAnswer, Noul, NoulAnswer, Score, ScoreAnswer, Usage

DEFAULT_MAX_REQUEST_TOKENS = 262_144


class RequestTooLarge(ValueError):
    """The request needs more tokens than a configured or model limit allows."""


@dataclass
class Engine:
    backend: Backend
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    # Fitted temperatures (prefill calibrate), applied to every answer; None serves raw model probabilities.
    calibration: Calibration | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ask(self, state: Any, questions: Mapping[str, Noul | Choice | Score]) -> tuple[dict[str, Answer], Usage]:
        renderer = self.backend.renderer
        state_ids = renderer.state(state)
        unique: dict[Branches, int] = {}    # identical questions are scored once, and so answered alike
        slot = {}
        for qid, q in questions.items():
            slot[qid] = unique.setdefault(renderer.question(q), len(unique))
        branches = list(unique)
        n_tokens = self._check_limits(state_ids, branches)
        with self._lock:  # one forward at a time; concurrent requests queue here
            scores = self.backend.score(state_ids, branches)
        answers = {qid: self._answer(q, scores[slot[qid]]) for qid, q in questions.items()}
        return answers, Usage(input_tokens=n_tokens, output_tokens=0)

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

    def _answer(self, q: Noul | Choice | Score, loglik: Sequence[float]) -> Answer:
        probs = softmax(self.calibration.adjust(q.type, loglik) if self.calibration else loglik)
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
