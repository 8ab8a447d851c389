"""`prefill distill`: a model that answers well but slowly (System Two: any chat LLM behind an
OpenAI-compatible endpoint, another System One server, or a bigger model through prefill) teaches a fast
prefill (System One) on the user's own unlabelled rows.

1. `teach`: the teacher answers every question about every row, several rows at a time for a remote
   teacher, each failure retried and then recorded with its kind (never fatal: a row's, or one question's
   when a chat server times out or replies with no declared answer), at most `rate` rows a second, into a
   journal (`teacher.jsonl`) that a rerun continues, asking only what is still unanswered. Its
   distributions are kept (logprobs where the server gives them, else its choice as a one-hot: fallback.py).
2. `train_student`: the student's head is trained on the teacher's distributions of the training rows (the
   head training of `prefill train`: training.train_heads; the decoder or the encoder route).
3. `held_out_report`: on the held-out rows, agreement with the teacher's top answer, the student's log loss
   against the teacher's distribution, both accuracies where the rows carry gold labels, seconds per row of
   each, the agreement within bands of the teacher's own certainty, and the cascade: the share of questions
   escalated to the teacher below each confidence threshold (the same confidence `--fallback-below` reads)
   against the agreement that gives.
4. `learning_curve`: would asking the teacher more rows pay? The head fitted anew on a quarter, a half and
   all of the training rows, each scored on the same held-out questions.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..batch import read_rows, state_of
from ..engine import choice_confidence
from ..evaluation.evaluate import Item, gold_index
from ..evaluation.metrics import argmax
from ..fallback import is_unscored
from ..schema import AnyQuestion, Choice, Noul

if TYPE_CHECKING:
    from ..heads import Head
    from .fitting import Example


@dataclass
class Row:
    index: int  # 0-based, in file order
    line: int
    state: Any
    gold: dict[str, Any]  # question id -> gold label, where the row carries one


def read_distill_rows(
    source: Path, questions: Mapping[str, AnyQuestion], state_field: str | None, gold_field: str | None
) -> tuple[list[Row], list[tuple[int, str]]]:
    """The rows to teach, and (line, why) for those that cannot be read. `gold_field`: a field holding
    {question id: label}, or the label itself when there is one question; never part of the state (without
    `state_field` the state is the rest of the record), or the teacher and the student would read the answer
    (seen: a probe on whole records, gold included, looked far more right than the honest student)."""
    rows, skipped = [], []
    for index, (line, record) in enumerate(read_rows(source)):
        try:
            if isinstance(record, Exception):
                raise record
            gold = record.get(gold_field) if gold_field else None
            if gold is not None and not isinstance(gold, dict):
                gold = {next(iter(questions)): gold} if len(questions) == 1 else None
            shown = {k: v for k, v in record.items() if k != gold_field} if gold_field else record
            rows.append(Row(index, line, state_of(shown, state_field), dict(gold or {})))
        except ValueError as e:
            skipped.append((line, str(e)))
    return rows, skipped


# ---------------------------------------------------------------- 1. the teacher answers


def digest(state: Any) -> str:
    """What ties a journal entry to its row's content, so that an edited input file is re-asked, not paired
    with answers to another text."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


class Journal:
    """teacher.jsonl: one line per row taught, {row, state, probs, error, seconds} (`state`: the row's
    `digest`); a rerun keeps what is there for rows whose content has not changed."""

    def __init__(self, path: Path, questions: Mapping[str, AnyQuestion]):
        self.path = path
        header = {"prefill_distill": 1, "questions": {k: q.model_dump(mode="json") for k, q in questions.items()}}
        if path.exists():
            first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
            if first != header:
                raise ValueError(f"{path} was written for other questions; use another --out")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(header) + "\n", encoding="utf-8")
        self._lock = threading.Lock()

    def entries(self) -> dict[int, dict]:
        lines = self.path.read_text(encoding="utf-8").splitlines()[1:]
        return {e["row"]: e for e in map(json.loads, lines)}

    def append(self, entry: dict) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def answers_of(teacher, state: Any, questions: Mapping[str, AnyQuestion]) -> tuple[dict, dict[str, str]]:
    """The teacher's distributions and {question id: why} for those it gave none: a remote teacher says why
    (fallback.FallbackError's kinds); a local prefill answers every question or raises."""
    if hasattr(teacher, "answers"):
        probs, _, failed = teacher.answers(state, questions)
        return probs, failed
    probs, _, _ = teacher.probabilities(state, questions)
    return probs, {qid: "no answer" for qid in questions if qid not in probs}


def ask_teacher(teacher, row: Row, questions: Mapping[str, AnyQuestion], retries: int, known=None) -> dict:
    """The teacher's distributions for one row: the questions not in `known` (answered on an earlier run),
    each unanswered one asked again up to `retries` times with backoff. Recorded, never raised: `failed`
    has why each question still has no answer, and `error` why the row got none at all."""
    started, probs, failed, error = time.perf_counter(), dict(known or {}), {}, None
    for attempt in range(retries + 1):
        todo = {qid: q for qid, q in questions.items() if qid not in probs}
        try:
            got, failed = answers_of(teacher, row.state, todo)
            probs.update(got)
            error = None
        except Exception as e:  # noqa: BLE001 — a refusal, timeout or unparseable reply is counted, not fatal
            error = f"{type(e).__name__}: {e}"
            failed = dict.fromkeys(todo, error)
        if len(probs) == len(questions) or attempt == retries:
            break
        time.sleep(0.5 * 2**attempt)
    seconds = time.perf_counter() - started
    entry = {"row": row.index, "state": digest(row.state), "probs": probs or None, "failed": failed}
    return {**entry, "error": None if probs else error or "no question answered", "seconds": seconds}


def unanswered(entry: dict | None, questions: Mapping[str, AnyQuestion]) -> list[str]:
    """The questions a journal entry has no distribution for (all of them for a row never asked)."""
    probs = (entry or {}).get("probs") or {}
    return [qid for qid in questions if qid not in probs]


def teach(
    connect: Callable[[], Any],
    rows: Sequence[Row],
    questions: Mapping[str, AnyQuestion],
    journal: Journal,
    *,
    concurrency: int = 1,
    retries: int = 2,
    rate: float | None = None,
) -> dict[int, dict]:
    """Every row the journal has no full answer for yet (new rows, rows that failed before, and rows with
    questions left unanswered, of which only those are asked again), asked `concurrency` at a time, at most
    `rate` rows a second; the journal's entries, old and new (the last per row), for the rows as they are now
    (an entry for a row whose text has changed since is dropped and the row asked again). `connect()` makes
    the teacher, called only when a row needs asking: retraining the student on a finished journal (another
    --kind or --model) never loads a local teacher (the 1.5B: about 30 s and 6 GB) or opens a connection."""
    from tqdm import tqdm

    current = {r.index: digest(r.state) for r in rows}

    def kept() -> dict[int, dict]:
        return {i: e for i, e in journal.entries().items() if e.get("state", current.get(i)) == current.get(i)}

    before = kept()
    pending = [r for r in rows if unanswered(before.get(r.index), questions)]
    gap = 1.0 / rate if rate else 0.0
    teacher = connect() if pending else None
    with (
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
        tqdm(total=len(rows), initial=len(rows) - len(pending), desc="teacher", unit="row", file=sys.stderr) as bar,
    ):
        futures = []
        for row in pending:
            known = (before.get(row.index) or {}).get("probs")
            futures.append(pool.submit(ask_teacher, teacher, row, questions, retries, known))
            time.sleep(gap)
        for future in as_completed(futures):
            journal.append(future.result())
            bar.update()
    return kept()


def teacher_summary(entries: Mapping[int, dict], questions: Mapping[str, AnyQuestion]) -> dict:
    """Rows taught, rows that got no answer at all, questions left unanswered by kind (fallback.FallbackError's:
    down, timeout, status, unparseable; other), and the most common reasons."""
    from ..fallback import failure_kind

    failed = [e for e in entries.values() if e["error"]]
    answered = [e for e in entries.values() if not e["error"]]
    reasons = [
        (e.get("failed") or {}).get(qid) or e["error"] or "no answer"
        for e in entries.values()
        for qid in unanswered(e, questions)
    ]
    kinds: dict[str, int] = {}
    errors: dict[str, int] = {}
    for why in reasons:
        kinds[failure_kind(why)] = kinds.get(failure_kind(why), 0) + 1
        errors[why[:120]] = errors.get(why[:120], 0) + 1
    seconds = [e["seconds"] for e in answered]
    return {
        "rows": len(entries),
        "failed_rows": len(failed),
        "unanswered_questions": len(reasons),
        "unanswered_by_kind": dict(sorted(kinds.items())),
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        "seconds_per_row": sum(seconds) / len(seconds) if seconds else None,
    }


# ---------------------------------------------------------------- 2. the student learns


def label_of(q: AnyQuestion, index: int) -> Any:
    """The gold label (as labelled JSONL writes it) of a question's `index`-th answer."""
    if isinstance(q, Noul):
        return index == 0
    if isinstance(q, Choice):
        return list(q.criteria)[index]
    return index


def student_items(
    rows: Sequence[Row], entries: Mapping[int, dict], questions: Mapping[str, AnyQuestion]
) -> tuple[list[Item], dict[str, list[float]]]:
    """Labelled items (the teacher's top answer as the label) and the teacher's distributions, keyed as
    `prefill train` reads a teacher (fitting.question_key)."""
    from .fitting import question_key

    items, teacher = [], {}
    for row in rows:
        probs = (entries.get(row.index) or {}).get("probs") or {}
        asked = {qid: q for qid, q in questions.items() if qid in probs}
        if not asked:
            continue
        gold = {qid: label_of(q, max(range(len(probs[qid])), key=probs[qid].__getitem__)) for qid, q in asked.items()}
        items.append(Item(row.state, asked, gold, family="distill"))
        teacher.update({question_key(row.state, q): probs[qid] for qid, q in asked.items()})
    return items, teacher


def split(rows: Sequence[Row], holdout: float, seed: int = 0) -> tuple[list[Row], list[Row]]:
    """Training rows and held-out rows (a `holdout` share, at least one of each when there are two)."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    n_held = min(len(order) - 1, max(1, round(holdout * len(order)))) if len(order) > 1 else 0
    return order[n_held:], order[:n_held]


# ---------------------------------------------------------------- 3. held out: student vs teacher


def held_out_report(
    student, rows: Sequence[Row], entries: Mapping[int, dict], questions: Mapping[str, AnyQuestion], target: float
) -> dict:
    """The student (an Engine) on the held-out rows the teacher answered, question by question."""
    per_question, started = [], time.perf_counter()
    for row in rows:
        probs = (entries.get(row.index) or {}).get("probs") or {}
        asked = {qid: q for qid, q in questions.items() if qid in probs}
        if not asked:
            continue
        mine, _, _ = student.probabilities(row.state, asked)
        for qid, q in asked.items():
            per_question.append(_compare(q, mine[qid], probs[qid], row.gold.get(qid)))
    seconds = (time.perf_counter() - started) / max(1, len(rows))
    if not per_question:
        return {"questions": 0}
    n = len(per_question)
    with_gold = [p for p in per_question if p["gold"] is not None]
    report = {
        "rows": len(rows),
        "questions": n,
        "student_seconds_per_row": seconds,
        "agreement": agreement(per_question),
        "log_loss_vs_teacher": sum(p["log_loss"] for p in per_question) / n,
    }
    if with_gold:
        report["gold_questions"] = len(with_gold)
        report["student_accuracy"] = sum(p["student_right"] for p in with_gold) / len(with_gold)
        report["teacher_accuracy"] = sum(p["teacher_right"] for p in with_gold) / len(with_gold)
    scored = [p for p in per_question if p["teacher_scored"]]
    report["by_teacher_certainty"] = by_teacher_certainty(scored)
    choice_only = [p for p in per_question if not p["teacher_scored"]]
    report["teacher_choice_only"] = {
        "questions": len(choice_only),
        "agreement": agreement(choice_only),
    }
    report["cascade"] = cascade(per_question)
    reached = [c for c in report["cascade"] if c["agreement"] >= target]
    report["cascade_for_target"] = {"target": target, **(reached[0] if reached else {"reached": False})}
    return report


def _compare(q: AnyQuestion, student: Sequence[float], teacher: Sequence[float], gold: Any) -> dict:
    gold_i = gold_index(q, gold) if gold is not None else None
    return {
        "agrees": argmax(student) == argmax(teacher),
        "confidence": choice_confidence(student),
        "log_loss": _cross_entropy(teacher, student),
        "gold": gold_i,
        "student_right": argmax(student) == gold_i,
        "teacher_right": argmax(teacher) == gold_i,
        "teacher_top": max(teacher),
        "teacher_scored": not is_unscored(list(teacher)),
    }


def _cross_entropy(teacher: Sequence[float], student: Sequence[float]) -> float:
    return -sum(t * math.log(max(s, 1e-12)) for s, t in zip(student, teacher))


def agreement(per_question: Sequence[dict]) -> float | None:
    """The share of questions whose top answer the student and the teacher share; None for none."""
    return sum(p["agrees"] for p in per_question) / len(per_question) if per_question else None


def by_teacher_certainty(per_question: Sequence[dict], edges: Sequence[float] = (0.5, 0.7, 0.9)) -> list[dict]:
    """The agreement within bands of the teacher's own certainty (its top answer's probability). Where the
    teacher is torn between two answers, its top one is close to a coin flip that no student learns from the
    text: on the routing tasks the student agreed on every held-out question the teacher gave 0.9 or more
    and on 42-50 % of those it gave under 0.5 (docs/measurements/distillation.md), so this says how much of a shortfall
    is the teacher's indecision rather than the student's. Pass only the questions the teacher scored: a
    choice that came without probabilities (`fallback.unscored`: a chat server that returns no logprobs)
    reads 0.9 whatever the teacher's doubt, and would fill the top band (held_out_report counts those apart)."""
    bounds = [0.0, *edges, math.inf]
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        band = [p for p in per_question if lo <= p["teacher_top"] < hi]
        out.append(
            {"teacher_top_at_least": lo, "below": min(hi, 1.0), "questions": len(band), "agreement": agreement(band)}
        )
    return out


def cascade(per_question: Sequence[dict], steps: int = 20) -> list[dict]:
    """Questions the student is less sure of than a threshold go to the teacher (whose answer then agrees):
    per threshold, the share escalated and the agreement, from none escalated to all."""
    out, n = [], len(per_question)
    for k in range(steps + 1):
        threshold = k / steps
        escalated = [p for p in per_question if p["confidence"] < threshold]
        kept_agree = sum(p["agrees"] for p in per_question if p["confidence"] >= threshold)
        out.append(
            {"threshold": threshold, "escalated": len(escalated) / n, "agreement": (kept_agree + len(escalated)) / n}
        )
    return out


# ---------------------------------------------------------------- 4. would more rows help


# The shares of the training rows the learning curve refits the head on (whole rows, in one shuffled order).
CURVE = (0.25, 0.5)


def learning_curve(
    train: Sequence[Example],
    held: Sequence[Example],
    layers: Sequence[int],
    final: Head,
    *,
    fractions: Sequence[float] = CURVE,
    seed: int = 0,
) -> list[dict]:
    """The head fitted anew (`final`'s kind, model selection and all) on nested shares (`fractions`) of the
    training rows, and `final` (trained on all of them), each scored on the same held-out questions: the
    agreement with the teacher's top answer and the log loss against its distribution. Why: whether asking
    the teacher more rows would pay is the one question a user with a journal has left. A curve still rising
    at all the rows says it would; a flat one says the shortfall is elsewhere. Measured (docs/measurements/
    distillation.md#would-more-rows-carry-routing-the-learning-curve): routing to ten clinics rose 0.69, 0.78, 0.82
    over 77, 154 and 309 rows; routing to six mailing lists stayed at 0.79, 0.78, 0.80 over 192 to 768, where the
    teacher is torn on 44 % of the e-mails (`by_teacher_certainty`). The last point scores the saved head on the
    features it is served with, so it repeats the held-out report's agreement."""
    from .fitting import predict
    from .train import fit_readouts

    rows = sorted({e.item for e in train})
    random.Random(seed).shuffle(rows)
    options = dict(kind=final.cfg.kind, model=final.cfg.model, fingerprint=final.cfg.fingerprint)
    heads = []
    for k, fraction in enumerate(fractions, 1):
        kept = set(rows[: max(2, round(fraction * len(rows)))])
        subset = [e for e in train if e.item in kept]
        print(
            f"learning curve {k}/{len(fractions)}: the head refitted on {len(kept)} of {len(rows)} rows",
            file=sys.stderr,
        )
        fitted = fit_readouts(subset, layers, rl_weight=0.0, label_weight=0.0, progress=True, **options)
        heads.append((len(kept), fitted[0]))
    heads.append((len(rows), final))
    scored = [e for e in held if e.teacher is not None]
    teacher = [e.teacher.tolist() for e in scored]
    out = []
    for n, head in heads:
        probs = predict(head, scored, len(layers) - 1)
        out.append(
            {
                "rows": n,
                "agreement": sum(argmax(p) == argmax(t) for p, t in zip(probs, teacher)) / max(1, len(scored)),
                "log_loss_vs_teacher": sum(map(_cross_entropy, teacher, probs)) / max(1, len(scored)),
            }
        )
    return out
