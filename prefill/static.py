"""The static student: a table lookup, a mean and one small product per question, answering the questions a
teacher taught it (`prefill distill --student static`) in well under a millisecond, with numpy alone.

A text's features are two bags read from its tokens (the encoder's tokenizer; static_features.py reads them):

- **meaning**: the mean of the tokens' rows of a static embedding table, L2-normalised. The table gives each
  token of an encoder's vocabulary the vector the encoder gives it alone, reduced by PCA and weighted down for
  frequent tokens (model2vec's recipe: training/static.py builds it from the local encoder);
- **form**: the tokens, pairs of neighbouring tokens and three-byte pieces of the UTF-8 text, hashed into
  HASH_BUCKETS counts, L2-normalised (what tells French from Dutch, or a spam template from a mailing-list
  reply, where the mean of meanings blurs it).

Each question it was taught has a weight matrix and a bias over both (a multinomial logistic regression trained
on the teacher's distributions) and a temperature fitted out of fold; its answer is softmax(W f + b) / T, in the
order the request declares the answers. A question is known by what it asks (type, instructions, answers and
their criteria; answers in any order), never by its id, so an answer does not move with the id it is asked under,
the other questions asked beside it or the order of its options. Every row is computed on its own, with the
same calls whatever else is asked, so it is the same bits in a batch and alone.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .backends.base import Backend, ReadoutUnsupported
from .engine import Decision, EngineRequest, Scored, choice_confidence, wire_answer
from .render import render_text
from .schema import AnyQuestion, Choice, Usage, answer_labels
from .static_features import HASH_BUCKETS, Features, read

log = logging.getLogger("prefill.static")

FORMAT = 1
CONFIG = "static.json"
WEIGHTS = "static.npz"
TOKENIZER = "tokenizer.json"


def is_static(folder: str | Path) -> bool:
    """Whether a readout folder holds a static student (else a decoder or encoder head)."""
    return (Path(folder) / CONFIG).is_file()


def signature(q: AnyQuestion) -> str:
    """What a question asks, whatever its id and (for a choice) the order of its options: its type, its
    instructions, its answers with their criteria, its opposite."""
    dumped = q.model_dump(mode="json", exclude_none=True)
    criteria = dumped.get("criteria")
    if isinstance(q, Choice):
        items = criteria.items() if isinstance(criteria, dict) else ((name, None) for name in criteria)
        dumped["criteria"] = sorted([name, about] for name, about in items)
    return json.dumps(dumped, sort_keys=True, ensure_ascii=False)


@dataclass
class Taught:
    """One question the student was taught: its answers in the order of its weights' rows, and its head."""

    signature: str
    answers: list[str]
    meaning_weights: np.ndarray  # (answers, dims) float32
    form_weights: np.ndarray  # (HASH_BUCKETS, answers) float32: a bucket's weights together, as a row reads them
    bias: np.ndarray  # (answers,)
    temperature: float

    @classmethod
    def of(cls, signature: str, answers: list[str], weights: np.ndarray, bias: np.ndarray, temperature: float):
        """From the weights as saved: (answers, dims + HASH_BUCKETS), the meaning's columns first."""
        dims = weights.shape[1] - HASH_BUCKETS
        meaning, form = np.ascontiguousarray(weights[:, :dims]), np.ascontiguousarray(weights[:, dims:].T)
        return cls(signature, answers, meaning, form, bias, temperature)

    @property
    def bytes(self) -> int:
        return int(self.meaning_weights.nbytes + self.form_weights.nbytes + self.bias.nbytes)

    def positions(self, order: Sequence[str]) -> np.ndarray:
        """Where the answers named in `order` (a request's order) sit among this head's."""
        where = {name: i for i, name in enumerate(self.answers)}
        return np.array([where[name] for name in order], dtype=np.int64)

    def probabilities(self, features: Features) -> np.ndarray:
        """(rows, answers) in the head's own order: softmax(W f + b) / T, every row on its own numbers. Rows are
        taken a few at a time, so that a 255-answer question's products stay a few megabytes."""
        step = max(1, 4096 // len(self.answers))
        if len(features) <= step:
            return self._probabilities(features)
        return np.concatenate([self._probabilities(features.take(np.arange(i, min(i + step, len(features)))))
                               for i in range(0, len(features), step)])  # fmt: skip

    def _probabilities(self, f: Features) -> np.ndarray:
        logits = (f.meaning[:, None, :] * self.meaning_weights[None]).sum(-1)  # a row's sums: its own, in order
        pieces = np.diff(f.starts)
        if pieces.any():
            products = self.form_weights.take(f.buckets, axis=0)  # take: 6x faster than [] on these shapes
            products *= f.values[:, None]
            logits[pieces > 0] += np.add.reduceat(products, f.starts[:-1][pieces > 0], axis=0)
        logits = (logits + self.bias).astype(np.float64) / self.temperature
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)


class StaticStudent:
    """A static student's folder, loaded: its tokenizer, its table and the heads of the questions it knows."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.folder = folder
        self.config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        if self.config.get("prefill_static") != FORMAT:
            raise ValueError(f"{folder}: not a static student of this version (prefill_static {FORMAT})")
        arrays = np.load(folder / WEIGHTS)
        self.table = arrays["table"].astype(np.float32)
        self.tokenizer = Tokenizer.from_file(str(folder / TOKENIZER))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.name = self.config["name"]
        self.taught = {
            q["signature"]: Taught.of(q["signature"], q["answers"], arrays[f"w{i}"], arrays[f"b{i}"], q["temperature"])
            for i, q in enumerate(self.config["questions"])
        }
        self.hand_off_below = self.config.get("hand_off_below")

    @property
    def bytes(self) -> int:
        return int(self.table.nbytes + sum(t.bytes for t in self.taught.values()))

    def knows(self, q: AnyQuestion) -> bool:
        return signature(q) in self.taught

    def features(self, states: Sequence[Any]) -> Features:
        """The states' meaning, form and token counts (module docstring), a row each. The texts are tokenized
        together (`encode_batch_fast`: the tokenizer's threads, on every core) and read together, each row with
        the same arithmetic as alone (`Features`)."""
        return read(self.tokenizer, self.table, [render_text(state) for state in states])

    def probabilities(self, state: Any, questions: Mapping[str, AnyQuestion]) -> tuple[dict[str, list[float]], int]:
        """Each question's distribution over its declared answers, and the tokens read. Every question must be
        one it knows (`knows`)."""
        features = self.features([state])
        asked = {qid: self.head(q) for qid, q in questions.items()}
        if None in asked.values():
            raise KeyError(f"not taught: {', '.join(qid for qid, head in asked.items() if head is None)}")
        return self.distributions(features, [asked])[0], int(features.tokens[0])

    def head(self, q: AnyQuestion) -> tuple[Taught, np.ndarray] | None:
        """The head that answers `q` and where its answers sit in `q`'s order; None where it was not taught."""
        taught = self.taught.get(signature(q))
        return None if taught is None else (taught, taught.positions(answer_labels(q)))

    def distributions(
        self, features: Features, asked: Sequence[Mapping[str, tuple[Taught, np.ndarray]]]
    ) -> list[dict[str, list[float]]]:
        """Row by row, each question asked of it (its head and order, `head`) with its distribution. Each head
        reads only the rows that asked it, once for all of them."""
        rows_of: dict[str, list[int]] = {}
        for row, heads in enumerate(asked):
            for sig in dict.fromkeys(taught.signature for taught, _ in heads.values()):
                rows_of.setdefault(sig, []).append(row)
        found = {}
        for sig, rows in rows_of.items():
            some = features if len(rows) == len(features) else features.take(rows)
            found[sig] = dict(zip(rows, self.taught[sig].probabilities(some)))
        return [
            {qid: found[taught.signature][row][order].tolist() for qid, (taught, order) in heads.items()}
            for row, heads in enumerate(asked)
        ]


def fingerprint(folder: str | Path) -> str:
    """What ties a static student to its files (the served model's name carries it)."""
    return f"{zlib.crc32((Path(folder) / WEIGHTS).read_bytes()):08x}"


# ---------------------------------------------------------------- served: the first tier of a cascade


class StaticBackend(Backend):
    """What the server reads of a backend (its name, description, counters), for a static student."""

    answers_by = "static student: a table lookup and a small head per question"

    def __init__(self, student: StaticStudent):
        self.student = student
        self.name = student.name
        self.max_context = 1 << 30
        self.weight_bytes = student.bytes
        self.tokens_run = 0


@dataclass
class StaticEngine:
    """An engine over a static student (Engine's interface: what the server, the scheduler and `prefill batch`
    call). A question it was taught is answered by it; one it is less sure of than `hand_off_below` (the
    confidence `--fallback-below` reads), or was not taught, goes to `fallback`, the next tier (the decoder
    engine, itself with its own fallback: a cascade); without a next tier, a question it was not taught is a 400
    that says which questions it knows."""

    student: StaticStudent
    fallback: Any = None  # the next tier: an Engine (its `decide`, fallback and all) or a remote
    hand_off_below: float | None = None
    served_as: str | None = None
    # `prefill batch`'s rows a group: each group's journal write is flushed to disk (fsync), which small groups of
    # sub-millisecond rows would spend most of their time on
    rows_per_batch: ClassVar[int] = 512
    # `prefill batch` answers this many groups ahead, in threads, while it journals the one before
    # (batch.answered_groups): the tokenizer runs without the GIL, beside the journal's JSON
    answers_ahead: ClassVar[int] = 1

    def __post_init__(self) -> None:
        self.backend = StaticBackend(self.student)

    @property
    def name(self) -> str:
        return self.served_as or self.student.name

    @property
    def description(self) -> str:
        known = len(self.student.taught)
        after = f", then {self.fallback.name}" if getattr(self.fallback, "name", None) else ""
        return f"{self.student.name} (static student, {known} question{'s' * (known != 1)}{after})"

    def ask(self, state, questions, reference_date=None):
        d = self.decide(state, questions, reference_date)
        return d.answers, d.usage

    def decide(self, state, questions, reference_date=None) -> Decision:
        found = self.score_requests([EngineRequest(state, questions, reference_date)])[0]
        if isinstance(found, Exception):
            raise found
        return self.conclude(state, questions, reference_date, found)

    def decide_many(self, requests):
        found = self.score_requests(requests)
        return [f if isinstance(f, Exception) else self.conclude(*r, f) for r, f in zip(requests, found)]

    def probabilities(self, state, questions, reference_date=None):
        d = self.decide(state, questions, reference_date)
        return {qid: distribution(questions[qid], a) for qid, a in d.answers.items()}, d.usage.input_tokens, []

    def score_requests(self, requests) -> list[Scored | Exception]:
        """Each request's distributions for the questions the student knows (the rest are left for `conclude`
        to hand on, or refused here when there is no next tier)."""
        heads: dict[int, tuple | None] = {}  # id(question) -> (Taught, order), or None: looked up once for a batch
        known_of: list[dict[str, tuple] | Exception] = []
        for _, questions, _ in map(EngineRequest._make, requests):
            for q in questions.values():
                if id(q) not in heads:
                    heads[id(q)] = self.student.head(q)
            unknown = [qid for qid, q in questions.items() if heads[id(q)] is None]
            if unknown and self.fallback is None:
                known_of.append(ReadoutUnsupported(self._refusal(unknown)))
            else:
                known_of.append({qid: heads[id(q)] for qid, q in questions.items() if qid not in unknown})
        rows = [i for i, known in enumerate(known_of) if known and not isinstance(known, Exception)]
        features = self.student.features([requests[i][0] for i in rows])
        found = dict(zip(rows, zip(self.student.distributions(features, [known_of[i] for i in rows]),
                                   features.tokens.tolist())))  # fmt: skip
        out: list[Scored | Exception] = []
        for i, known in enumerate(known_of):
            if isinstance(known, Exception):
                out.append(known)
                continue
            probs, n = found.get(i, ({}, 0))
            self.backend.tokens_run += n
            out.append(Scored(probs, n, [], []))
        return out

    def conclude(self, state, questions, reference_date, found: Scored) -> Decision:
        probs, n_tokens = dict(found.probs), found.n_tokens
        unsure = [qid for qid in questions if qid not in probs]
        if self.hand_off_below is not None:
            unsure += [qid for qid, p in probs.items() if choice_confidence(p) < self.hand_off_below]
        escalated, low = [], []
        if unsure and self.fallback is not None:
            try:
                more, extra = self._next_tier(state, {q: questions[q] for q in unsure}, reference_date)
            except Exception as e:  # noqa: BLE001 — a failed next tier keeps the student's answers, or refuses
                log.warning("the next tier failed: %s: %s", type(e).__name__, e)
                more, extra = {}, 0
                if any(qid not in probs for qid in unsure):
                    raise ReadoutUnsupported(f"{self._refusal([q for q in unsure if q not in probs])}: {e}") from e
            probs.update(more)
            n_tokens += extra
            escalated = [q for q in unsure if q in more]
            low = [q for q in unsure if q not in more]
        elif unsure:
            low = unsure
        answers = {qid: wire_answer(q, probs[qid]) for qid, q in questions.items()}
        return Decision(answers, Usage(input_tokens=n_tokens, output_tokens=0), low, escalated)

    def _next_tier(self, state, questions, reference_date) -> tuple[dict[str, list[float]], int]:
        """The next tier's distributions: an engine decides (and hands on what it is unsure of, to its own
        fallback), a remote server answers."""
        if hasattr(self.fallback, "decide"):
            d = self.fallback.decide(state, questions, reference_date)
            return {qid: distribution(questions[qid], a) for qid, a in d.answers.items()}, d.usage.input_tokens
        more, extra, _ = self.fallback.probabilities(state, questions, reference_date)
        return more, extra

    def _refusal(self, unknown: Sequence[str]) -> str:
        taught = [json.loads(s)["instructions"] for s in self.student.taught]
        return (
            f"the static student {self.student.name!r} answers only the questions it was taught, known by their type, "
            f"instructions and answers (not their id): {', '.join(map(repr, taught))}; "
            f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not one of them, and no base "
            "model is served behind it"
        )

    def forget_priors(self) -> None:
        pass


def distribution(q: AnyQuestion, answer) -> list[float]:
    """A wire answer back as a distribution over the question's declared answers."""
    if answer.type == "noul":
        return [answer.noul, 1.0 - answer.noul]
    return [answer.probabilities[name] for name in answer_labels(q)]
