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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from . import facts, schema
from .backends.base import Backend, ReadoutUnsupported, RequestTooLarge
from .calibration import Calibration, question_key
from .render import Branches, render_text
from .schema import Answer, AnyQuestion, Choice, ChoiceAnswer, Noul, NoulAnswer, ScoreAnswer, Usage, answer_labels
from .scoring import DEFAULT as DEFAULT_SCORING
from .scoring import PriorCache, Scoring, corrected, read_with_opposite, split_opposites

if TYPE_CHECKING:  # a trained readout's heads are torch modules; the engine (and a static student) need no torch
    from .heads import Heads

log = logging.getLogger("prefill.engine")
_BACKEND_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def backend_lock(backend: Backend) -> threading.Lock:
    """One lock per backend, shared by every engine on it (several readouts served on one copy of the
    weights): a backend runs one forward at a time and its state cache is not thread-safe."""
    try:
        return _BACKEND_LOCKS.setdefault(backend, threading.Lock())
    except TypeError:  # an unhashable or non-weakref-able backend (test doubles): its own lock
        return threading.Lock()


@dataclass
class Decision:
    """Everything the engine decided for one request; `ask` returns the wire part (answers, usage)."""

    answers: dict[str, Answer]
    usage: Usage
    low_confidence: list[str] = field(default_factory=list)  # under the fallback threshold, not escalated
    escalated: list[str] = field(default_factory=list)  # answered by the fallback engine instead
    early_exit: list[str] = field(default_factory=list)  # answered by the shallow readout head
    facts: list[str] = field(default_factory=list)  # answered exactly by the fact pass
    truncated: list[str] = field(default_factory=list)  # read with the state cut to fit (encoder route)


class EngineRequest(NamedTuple):
    """One System One request as the engine takes it."""

    state: Any
    questions: Mapping[str, AnyQuestion]
    reference_date: dt.date | None = None


@dataclass
class Scored:
    """The model's part of one request: each question's distribution, the tokens read, and which
    questions the fact pass and a shallow readout answered."""

    probs: dict[str, list[float]]
    n_tokens: int
    early_exit: list[str]
    facts: list[str]
    truncated: list[str] = field(default_factory=list)  # questions read with their state cut (encoder route)


@dataclass
class _Prepared:
    """A request rendered for the model: its questions' distinct branches (`slot`: question id -> branch; a
    question's opposite under (qid, "opposite"), `pairs`)."""

    found: Scored
    questions: dict[str, AnyQuestion]  # those the model answers (not the fact pass)
    state_ids: Sequence[int] = ()
    branches: list[Branches] = field(default_factory=list)
    qtypes: list[str] = field(default_factory=list)  # per branch
    labels: list[list[str]] = field(default_factory=list)  # per branch, its answers' names (heads)
    slot: dict[Any, int] = field(default_factory=dict)
    pairs: dict[str, Any] = field(default_factory=dict)

    def fill(self, per_branch: list[list[float]], exited: set[int], finish: Callable) -> None:
        """Each question's distribution, `finish(question, scores)`, from its branch's scores (log-scale),
        read with its opposite's where it has one."""
        for qid, q in self.questions.items():
            scores = per_branch[self.slot[qid]]
            if qid in self.pairs:
                scores = read_with_opposite(scores, per_branch[self.slot[self.pairs[qid]]])
            self.found.probs[qid] = finish(q, scores)
        self.found.early_exit = [qid for qid in self.questions if self.slot[qid] in exited]


@dataclass
class Engine:
    backend: Backend
    max_request_tokens: int = schema.DEFAULT_MAX_REQUEST_TOKENS
    max_sequence_tokens: int = schema.DEFAULT_MAX_SEQUENCE_TOKENS
    # Fitted temperatures (prefill calibrate), applied to every answer; None serves raw model probabilities.
    calibration: Calibration | None = None
    # Exact answers for single numeric/date comparisons (see facts.py and docs/measurements/facts.md).
    use_facts: bool = True
    # Trained heads (prefill train) read instead of the training-free log-likelihoods; they carry their own
    # calibration (per-type temperatures fitted on families they did not train on), so `calibration`, which
    # is the base model's, is not applied to them.
    heads: Heads | None = None
    # Questions whose confidence (p_max - 1/n)/(1 - 1/n), comparable across option counts, is under
    # `fallback_below` are re-asked to `fallback` if there is one (a stronger engine, or a remote server:
    # fallback.py), else reported. What the fallback cannot answer keeps its local answer and is reported.
    fallback_below: float | None = None
    fallback: Any = None
    # The served model name, when it is not the base model's (+ the readout's): `prefill serve --readout NAME=DIR`.
    served_as: str | None = None
    # How the training-free path turns token log-probabilities into answer scores, per question type
    # (scoring.py: token rule and correction; the default was chosen on real labelled text).
    scoring: Mapping[str, Scoring] = field(default_factory=lambda: dict(DEFAULT_SCORING))
    _priors: PriorCache = field(default_factory=PriorCache, repr=False)
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lock = backend_lock(self.backend)
        # A readout trained with a LoRA reads the adapted model: merge it wherever a readout meets its backend.
        if self.heads is not None and self.heads.adapter is not None:
            self.backend.merge_adapter(self.heads.adapter)

    def forget_priors(self) -> None:
        """Empty the content-free prior cache: the next request pays its questions' prior passes again, as a
        question asked for the first time does (`prefill bench` times that; a changed model must not reuse
        them)."""
        self._priors = PriorCache(self._priors.size)

    @property
    def name(self) -> str:
        """The served model name: the base model's, plus the readout's when one is loaded (or `served_as`)."""
        if self.served_as:
            return self.served_as
        return self.backend.name + (f"+{self.heads.name}" if self.heads else "")

    @property
    def description(self) -> str:
        if not self.heads:
            return self.backend.description
        return f"{self.backend.description}, with the trained readout {self.heads.name!r}"

    def ask(
        self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None = None
    ) -> tuple[dict[str, Answer], Usage]:
        """Answers for every question. `reference_date` is "today" for date questions; without it the fact
        pass uses the date the state gives ("Today is ..."), if any."""
        d = self.decide(state, questions, reference_date)
        return d.answers, d.usage

    def decide(
        self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None = None
    ) -> Decision:
        return self.conclude(state, questions, reference_date, self._score_one(state, questions, reference_date))

    def decide_many(self, requests: Sequence[EngineRequest]) -> list[Decision | Exception]:
        """`decide` for several independent requests (state, questions, reference date), their model work
        in shared passes (score_requests); a request that cannot be answered (too large, say) gets its
        exception in its place and does not fail the others."""
        found = self.score_requests(requests)
        return [f if isinstance(f, Exception) else self.conclude(*r, f) for r, f in zip(requests, found)]

    def conclude(
        self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None, found: Scored
    ) -> Decision:
        """The wire answers from the model's distributions, after asking the fallback about the questions
        the model is unsure of. Outside the backend lock: a remote fallback never holds up the model."""
        probs, n_tokens = dict(found.probs), found.n_tokens
        low, escalated = [], []
        if self.fallback_below is not None:
            low = [qid for qid, p in probs.items() if choice_confidence(p) < self.fallback_below]
        if low and self.fallback is not None:
            try:
                more, extra_tokens, _ = self.fallback.probabilities(
                    state, {q: questions[q] for q in low}, reference_date
                )
            except Exception as e:  # noqa: BLE001 — a fallback never fails the request: local answers stay
                log.warning("fallback failed, keeping the local answers: %s: %s", type(e).__name__, e)
                more, extra_tokens = {}, 0
            probs.update(more)
            n_tokens += extra_tokens
            low, escalated = [q for q in low if q not in more], [q for q in low if q in more]
        answers = {qid: self._answer(q, probs[qid]) for qid, q in questions.items()}
        return Decision(
            answers,
            Usage(input_tokens=n_tokens, output_tokens=0),
            low,
            escalated,
            found.early_exit,
            found.facts,
            found.truncated,
        )

    def probabilities(
        self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None = None
    ) -> tuple[dict[str, list[float]], int, list[str]]:
        """Each question's distribution over its declared answers (in declared order, noul: yes, no), the
        tokens the model read, and the questions a shallow readout answered."""
        found = self._score_one(state, questions, reference_date)
        return found.probs, found.n_tokens, found.early_exit

    def _score_one(self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None) -> Scored:
        found = self.score_requests([EngineRequest(state, questions, reference_date)])[0]
        if isinstance(found, Exception):
            raise found
        return found

    def score_requests(self, requests: Sequence[EngineRequest]) -> list[Scored | Exception]:
        """The model's part of `decide_many`: each request's distributions, before any fallback. The
        training-free path runs all requests' questions in shared passes (backend.score_many); trained
        readouts run request by request."""
        out: list[Scored | Exception] = []
        todo: list[tuple[int, _Prepared]] = []
        for state, questions, reference_date in map(EngineRequest._make, requests):
            try:
                prepared = self._prepare(state, questions, reference_date)
            except RequestTooLarge as e:
                out.append(e)
                continue
            out.append(prepared.found)
            if prepared.questions:
                todo.append((len(out) - 1, prepared))
        if not todo:
            return out
        with self._lock:  # one forward at a time; concurrent requests queue here (or in serving's scheduler)
            if self.heads is None:
                jobs = [(p.state_ids, p.branches, p.qtypes) for _, p in todo]
                for (_, p), scores in zip(todo, self.scores_many(jobs)):
                    p.fill(scores, set(), self._calibrated)
            else:
                for i, p in todo:
                    try:
                        p.fill(*self._read_heads(p.state_ids, p.branches, p.qtypes, p.labels), lambda q, s: softmax(s))
                    except ReadoutUnsupported as e:
                        out[i] = e
        return out

    def _prepare(self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None) -> _Prepared:
        """The fact pass, then the rest rendered to token branches (identical questions once), checked
        against the limits."""
        probs: dict[str, list[float]] = {}
        if self.use_facts:
            state_text = render_text(state)
            for qid, q in questions.items():
                exact = facts.decide(state_text, q, reference_date)
                if exact is not None:
                    probs[qid] = exact
        found = Scored(probs, 0, [], list(probs))
        questions = {qid: q for qid, q in questions.items() if qid not in probs}
        if not questions:
            return _Prepared(found, questions)
        renderer = self.backend.renderer
        state_ids = renderer.state(state)
        asked, pairs = split_opposites(questions)
        unique: dict[Branches, int] = {}  # identical questions are scored once, and so answered alike
        slot, qtypes, labels = {}, [], []
        for qid, q in asked.items():
            slot[qid] = unique.setdefault(renderer.question(q), len(unique))
            if slot[qid] == len(qtypes):
                qtypes.append(q.type)
                labels.append(answer_labels(q))
        branches = list(unique)
        found.n_tokens = self._check_limits(state_ids, branches)
        if self.backend.truncates:  # the encoder route cuts a state too long for its positions
            cut = {i for i, b in enumerate(branches) if self.backend.truncated(len(state_ids), b)}
            found.truncated = [qid for qid in questions if slot[qid] in cut]
        return _Prepared(found, questions, state_ids, branches, qtypes, labels, slot, pairs)

    def scores(
        self, state_ids: Sequence[int], branches: Sequence[Branches], qtypes: Sequence[str]
    ) -> list[list[float]]:
        """Training-free answer scores: each question's token rule over one packed pass, then its correction
        (a content-free prior per distinct question, cached). Before calibration."""
        return self.scores_many([(state_ids, branches, qtypes)])[0]

    def scores_many(
        self, jobs: Sequence[tuple[Sequence[int], Sequence[Branches], Sequence[str]]]
    ) -> list[list[list[float]]]:
        """`scores` for several (state, branches, types) at once, the model passes shared."""
        ways = [[self.scoring.get(t) or Scoring() for t in qtypes] for _, _, qtypes in jobs]
        cuts = [[w.branches(b) for w, b in zip(ws, branches)] for ws, (_, branches, _) in zip(ways, jobs)]
        raw = self.backend.score_many([(state, cut) for (state, _, _), cut in zip(jobs, cuts)])
        out = [[w.combine(c, s) for w, c, s in zip(ws, cut, r)] for ws, cut, r in zip(ways, cuts, raw)]
        renderer = self.backend.renderer
        flat = [(j, i, w) for j, ws in enumerate(ways) for i, w in enumerate(ws) if w.correction != "none"]
        for way in {w for _, _, w in flat}:
            idx = [(j, i) for j, i, w in flat if w == way]
            priors = self._priors.log_priors(
                way, [cuts[j][i] for j, i in idx], lambda text, bs: self.backend.score(renderer.state(text), bs)
            )
            for (j, i), prior in zip(idx, priors):
                out[j][i] = corrected(out[j][i], prior, way.prior_weight)
        return out

    def _calibrated(self, q: AnyQuestion, loglik: Sequence[float]) -> list[float]:
        """The base model's calibration (a question's own, by its content, where `calibrate --per-question`
        fitted one) on a question's scores, read with its opposite where it has one."""
        cal = self.calibration
        if cal is None:
            return softmax(loglik)
        return softmax(cal.adjust(q.type, loglik, question_key(q) if cal.by_question else "", answer_labels(q)))

    def _read_heads(
        self,
        state_ids: Sequence[int],
        branches: Sequence[Branches],
        qtypes: Sequence[str],
        labels: Sequence[Sequence[str]],
    ) -> tuple[list[list[float]], set[int]]:
        """Trained heads' scores (logits). With a shallow head, the questions first run through its layers only;
        those it is sure of stop there, the others continue through the remaining layers to the final head."""
        heads = self.heads
        final = heads.final
        if heads.early is None:
            feats = self.backend.features(state_ids, branches, [final.cfg.layer])
            return [self._head_scores(final, t, f, ls) for t, f, ls in zip(qtypes, feats, labels)], set()
        early, shallow = heads.early, {}

        def exits(i: int, f) -> bool:
            shallow[i] = self._head_scores(early, qtypes[i], f, labels[i])
            return choice_confidence(softmax(shallow[i])) >= early.cfg.exit_threshold

        pairs = self.backend.features_early_exit(state_ids, branches, early.cfg.layer, final.cfg.layer, exits)
        out = [
            shallow[i] if deep is None else self._head_scores(final, qtypes[i], deep, labels[i])
            for i, (_, deep) in enumerate(pairs)
        ]
        return out, {i for i, (_, deep) in enumerate(pairs) if deep is None}

    @staticmethod
    def _head_scores(head, qtype: str, f, labels: Sequence[str]) -> list[float]:
        return head.score(qtype, f.decision[0], f.options[:, 0], f.loglik, labels)

    def _check_limits(self, state: Sequence[int], branches: Sequence[Branches]) -> int:
        longest = len(state) + max(len(b.prompt) + max(len(a) for a in b.answers) for b in branches)
        context = self.backend.max_context
        if longest > context:
            raise RequestTooLarge(
                f"the state and its longest question need {longest} tokens; "
                f"the model's context limit is {context} tokens"
            )
        if longest > self.max_sequence_tokens:
            raise RequestTooLarge(
                f"the state and its longest question need {longest} tokens; the limit is "
                f"{self.max_sequence_tokens} (--max-sequence-tokens)"
            )
        total = len(state) + sum(b.n_tokens for b in branches)
        if total > self.max_request_tokens:
            raise RequestTooLarge(
                f"the request needs {total} tokens; the limit is {self.max_request_tokens} "
                "tokens per request (--max-request-tokens)"
            )
        return total

    def _answer(self, q: AnyQuestion, probs: Sequence[float]) -> Answer:
        return wire_answer(q, probs)


def wire_answer(q: AnyQuestion, probs: Sequence[float]) -> Answer:
    """A question's wire answer from its distribution over its declared answers."""
    if isinstance(q, Noul):
        return NoulAnswer(noul=probs[0])
    if isinstance(q, Choice):
        names = list(q.criteria)
        # Exact ties go to the name that sorts first, whatever the request's option order.
        best = min(range(len(names)), key=lambda i: (-probs[i], names[i]))
        return ChoiceAnswer(
            choice=names[best], probabilities=dict(zip(names, probs)), confidence=choice_confidence(probs)
        )
    return ScoreAnswer(
        score=sum(i * p for i, p in enumerate(probs)),
        legend={str(i): level for i, level in enumerate(q.criteria)},
        probabilities={str(i): p for i, p in enumerate(probs)},
        confidence=score_confidence(probs),
    )


def softmax(logits: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Softmax over the declared answers. Answers the model finds impossible (-inf) get 0; if every
    answer is impossible the distribution is uniform rather than NaN. The normaliser is summed exactly
    (`math.fsum`), so the order the options were declared in cannot move a probability even by a rounding
    (a plain sum of reordered terms can differ in its last bit: seen under `--exact`, where the model's
    scores are the same bits)."""
    finite = [x / temperature for x in logits if math.isfinite(x)]
    if not finite:
        return [1.0 / len(logits)] * len(logits)
    top = max(finite)
    exps = [math.exp(x / temperature - top) if math.isfinite(x) else 0.0 for x in logits]
    total = math.fsum(exps)
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
