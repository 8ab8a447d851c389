"""`prefill eval` and `prefill calibrate`: labelled evaluation, and temperatures fitted on it.

Data is JSONL, one item a line: {"state": ..., "questions": {id: question}, "gold": {id: answer}}, with
gold `true`/`false` for noul, an option name for choice, a level index for score, and optionally
"reference_date" (YYYY-MM-DD, "today" for date questions). `benchmarks/data/sys1bench.py`
writes sys1bench's policy-labelled tasks in this form.

The evaluation reports, per question type, accuracy, macro-F1, log loss, Brier, ECE with the ECE a
perfectly calibrated model would show on that many questions, and for scores the ranked probability
score and mean absolute error; a reliability diagram as PNG; and, with --generate, the same model asked
to generate its answer as text, parsed (accuracy and parse rate; generation gives no probabilities).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import sys
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter
from tqdm import tqdm

from ..calibration import Calibration, question_key
from ..engine import Engine
from ..render import render_question
from ..schema import AnyQuestion, Choice, Noul, Question, Score, answer_labels
from . import metrics

_QUESTIONS = TypeAdapter(dict[str, Question])


@dataclass
class Item:
    state: Any
    questions: dict[str, AnyQuestion]
    gold: dict[str, Any]
    reference_date: dt.date | None = None
    family: str = ""


def load_jsonl(path: str | Path) -> list[Item]:
    """Labelled items, one JSON object a line: {"state", "questions" (the wire form), "gold" ({id: answer}),
    "reference_date"?, "family"?}. Anything else is a ValueError naming the file and line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    items = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                items.append(_labelled_item(json.loads(line)))
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}:{n}: {_why(e)} (a labelled line is {LABELLED_LINE})") from None
    return items


LABELLED_LINE = '{"state": ..., "questions": {id: question}, "gold": {id: answer}}'


def _why(e: Exception) -> str:
    """One line for a bad labelled line: the missing field, pydantic's first error with where it is, or
    the message."""
    if isinstance(e, KeyError):
        return f"no {e} field"
    if hasattr(e, "errors"):  # pydantic's ValidationError
        first = e.errors()[0]
        return f"questions: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    return str(e)


def _labelled_item(row: Any) -> Item:
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    questions = parse_questions(row["questions"])
    gold = row["gold"]
    missing = set(questions) - set(gold)
    if missing:
        raise ValueError(f"no gold answer for {sorted(missing)}")
    for qid, q in questions.items():
        gold_index(q, gold[qid])  # validates
    today = dt.date.fromisoformat(row["reference_date"]) if row.get("reference_date") else None
    return Item(row["state"], questions, {k: gold[k] for k in questions}, today, row.get("family", ""))


def parse_questions(raw: dict) -> dict[str, AnyQuestion]:
    return _QUESTIONS.validate_python(raw)


def gold_index(q: AnyQuestion, gold: Any) -> int:
    if isinstance(q, Noul):
        if not isinstance(gold, bool):
            raise ValueError(f"noul gold must be true or false, not {gold!r}")
        return 0 if gold else 1
    if isinstance(q, Choice):
        names = list(q.criteria)
        if gold not in names:
            raise ValueError(f"choice gold {gold!r} is not one of the options {names}")
        return names.index(gold)
    if not isinstance(gold, int) or not 0 <= gold < len(q.criteria):
        raise ValueError(f"score gold must be a level index 0..{len(q.criteria) - 1}, not {gold!r}")
    return gold


def vector(answer) -> list[float]:
    """An answer's probabilities over its declared answers, in declared order (noul: yes, no)."""
    if answer.type == "noul":
        return [answer.noul, 1 - answer.noul]
    return list(answer.probabilities.values())


@dataclass
class LabelledAnswer:
    qtype: str
    probs: list[float]
    gold: int
    labels: list[str]
    item: int
    key: str = ""  # calibration.question_key: the question this answers, by content


def predict(engine: Engine, items: Sequence[Item], progress: str = "answering") -> list[LabelledAnswer]:
    out = []
    for i, item in enumerate(tqdm(items, desc=progress, unit="item", file=sys.stderr)):
        answers, _ = engine.ask(item.state, item.questions, item.reference_date)
        for qid, q in item.questions.items():
            gold = gold_index(q, item.gold[qid])
            out.append(LabelledAnswer(q.type, vector(answers[qid]), gold, answer_labels(q), i, question_key(q)))
    return out


def report(scored: Sequence[LabelledAnswer], calibration: Calibration | None = None) -> dict:
    by_type: dict[str, list[LabelledAnswer]] = defaultdict(list)
    for s in scored:
        by_type[s.qtype].append(s)
    out = {}
    for qtype, rows in sorted(by_type.items()):
        preds = [(calibrated(calibration, s), s.gold) for s in rows]
        out[qtype] = metrics.summary(preds, [s.labels for s in rows], ordinal=qtype == "score")
    return out


def calibrated(calibration: Calibration | None, s: LabelledAnswer) -> list[float]:
    return calibration.apply(s.qtype, s.probs, s.key, s.labels) if calibration else s.probs


def cross_validate(
    model: str,
    fingerprint: str,
    scored: Sequence[LabelledAnswer],
    folds: int = 5,
    buckets: bool = False,
    seed: int = 0,
    per_question: Collection[str] = (),
) -> dict:
    """Held-out metrics after calibration: items split into folds, temperatures fitted on the other folds
    and applied to this one; the held-out predictions of all folds are pooled."""
    item_ids = sorted({s.item for s in scored})
    random.Random(seed).shuffle(item_ids)
    fold_of = {item: k % folds for k, item in enumerate(item_ids)}
    held_out: list[LabelledAnswer] = []
    for k in range(folds):
        train = [s for s in scored if fold_of[s.item] != k]
        cal = fit(model, fingerprint, train, buckets, per_question)
        held_out += [
            LabelledAnswer(s.qtype, calibrated(cal, s), s.gold, s.labels, s.item, s.key)
            for s in scored
            if fold_of[s.item] == k
        ]
    return report(held_out)


def fit(
    model: str,
    fingerprint: str,
    scored: Sequence[LabelledAnswer],
    buckets: bool = False,
    per_question: Collection[str] = (),
) -> Calibration:
    """Temperatures per type (and bucket), and each question of a type in `per_question` its own."""
    by_type: dict[str, list] = defaultdict(list)
    by_question: dict[str, tuple[str, list[str], list]] = {}
    for s in scored:
        by_type[s.qtype].append((s.probs, s.gold))
        if s.qtype not in per_question:
            continue
        _, names, rows = by_question.setdefault(s.key, (s.qtype, s.labels, []))
        order = [s.labels.index(name) for name in names]  # the same question, its options declared in another order
        rows.append(([s.probs[i] for i in order], order.index(s.gold)))
    return Calibration.fit(model, fingerprint, dict(by_type), buckets=buckets, by_question=by_question)


# ---------------------------------------------------------------- generation baseline


def generate_baseline(engine: Engine, items: Sequence[Item], max_new_tokens: int = 12) -> dict:
    """The same prompt as prefill's, but the model generates its answer (greedy) and the text is parsed."""
    r = engine.backend.renderer
    hits: dict[str, list[bool]] = defaultdict(list)
    parsed: dict[str, list[bool]] = defaultdict(list)
    for item in tqdm(items, desc="generating (baseline)", unit="item", file=sys.stderr):
        state = r.state(item.state)
        for qid, q in item.questions.items():
            guess = generated_answer(engine.backend, state, q, max_new_tokens)
            parsed[q.type].append(guess is not None)
            hits[q.type].append(guess == gold_index(q, item.gold[qid]))
    return {
        t: {"n": len(v), "accuracy": round(sum(v) / len(v), 4), "parsed": round(sum(parsed[t]) / len(v), 4)}
        for t, v in sorted(hits.items())
    }


def generated_answer(backend, state_ids: Sequence[int], q: AnyQuestion, max_new_tokens: int = 12) -> int | None:
    """The declared answer the model generates (greedy) after prefill's own prompt for `q`, or None when
    its text starts with none of them."""
    tok = backend.renderer.tokenizer
    ids = torch.tensor([list(state_ids) + list(backend.renderer.question(q).prompt)])
    with torch.inference_mode():
        out = backend.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.eos_token_id,
        )
    return parse_answer(q, tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def parse_answer(q: AnyQuestion, text: str) -> int | None:
    """The declared answer a generated text starts with (longest match, case-insensitive), or None."""
    t = text.strip().strip("\"'*`").lower()
    answers = render_question(q).answers
    if isinstance(q, Noul):
        return 0 if t.startswith("yes") else 1 if t.startswith("no") else None
    if isinstance(q, Score):
        m = re.match(r"\d+", t)
        return int(m.group()) if m and int(m.group()) < len(answers) else None
    best = None
    for i, a in enumerate(answers):
        if t.startswith(a.lower()) and (best is None or len(a) > len(answers[best])):
            best = i
    return best


# ---------------------------------------------------------------- reliability diagram


def pyplot(path: Path):
    """matplotlib's pyplot (drawing to files), or None where matplotlib is not installed: it comes with the bench
    extra, not with prefill, so a command that draws says it skips `path` and does the rest."""
    try:
        import matplotlib
    except ImportError:
        print(
            f"prefill: {path.name} not drawn: matplotlib is not installed (pip install 'prefill[bench]')",
            file=sys.stderr,
        )
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reliability(
    scored: Sequence[LabelledAnswer], path: Path, title: str, calibration: Calibration | None = None
) -> None:
    if (plt := pyplot(path)) is None:
        return
    types = sorted({s.qtype for s in scored})
    fig, axes = plt.subplots(1, len(types), figsize=(4 * len(types), 4), dpi=110, squeeze=False)
    for ax, qtype in zip(axes[0], types):
        rows = [s for s in scored if s.qtype == qtype]
        for label, cal in (("raw", None), ("calibrated", calibration)) if calibration else (("raw", None),):
            preds = [(calibrated(cal, s), s.gold) for s in rows]
            bins = [b for b in metrics.reliability(preds) if b["n"]]
            ax.plot(
                [b["confidence"] for b in bins],
                [b["accuracy"] for b in bins],
                "o-",
                label=f"{label} (ECE {metrics.ece(preds):.3f})",
            )
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.set_title(f"{qtype} (n={len(rows)})")
        ax.set_xlabel("confidence of the top answer")
        ax.set_ylabel("accuracy")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------- what prefill eval and calibrate report


def score_uncalibrated(pf, items: Sequence[Item], facts: bool) -> list[LabelledAnswer]:
    """Every item answered by `pf`'s backend, readouts and scoring, before calibration."""
    raw = Engine(
        pf.backend,
        max_request_tokens=pf.engine.max_request_tokens,
        use_facts=facts,
        heads=pf.engine.heads,
        scoring=pf.engine.scoring,
    )
    return predict(raw, items)


def evaluation(pf, items: Sequence[Item], scored: Sequence[LabelledAnswer], folds: int, generate: bool) -> dict:
    """`prefill eval`'s report: raw, with the engine's calibration (a trained head carries its own),
    calibrated out of fold, and the model generating its answers (`generate`)."""
    result: dict = {"model": pf.name, "fingerprint": pf.backend.fingerprint, "items": len(items), "raw": report(scored)}
    cal = None if pf.engine.heads else pf.engine.calibration
    if cal is not None:
        result["calibrated"] = report(scored, cal)
        result["temperatures"] = cal.parameters()
    result["calibrated_cross_validated"] = cross_validate(pf.name, pf.backend.fingerprint, scored, folds)
    if generate:
        result["generate_and_parse"] = generate_baseline(pf.engine, items)
    return result


def calibrate(
    pf, items: Sequence[Item], scored: Sequence[LabelledAnswer], folds: int, try_buckets: bool, try_questions: bool
) -> tuple[Calibration, dict]:
    """`prefill calibrate`: temperatures per question type; per option-count bucket (`try_buckets`) where those
    do better out of fold; then per question (`try_questions`) for each type whose held-out log loss it
    lowers. The held-out numbers behind each choice are in the result."""
    fp = pf.backend.fingerprint
    per_type = cross_validate(pf.name, fp, scored, folds)
    result: dict = {"model": pf.name, "items": len(items), "raw": report(scored), "held_out_per_type": per_type}
    best, buckets, per_question = per_type, False, frozenset()
    if try_buckets:
        result["held_out_per_bucket"] = cross_validate(pf.name, fp, scored, folds, buckets=True)
        if total_log_loss(result["held_out_per_bucket"]) < total_log_loss(per_type):
            best, buckets = result["held_out_per_bucket"], True
    if try_questions:
        own = cross_validate(pf.name, fp, scored, folds, buckets=buckets, per_question=frozenset(best))
        result["held_out_per_question"] = own
        per_question = frozenset(t for t in best if own[t]["log_loss"] < best[t]["log_loss"])
        best = {t: own[t] if t in per_question else m for t, m in best.items()}
    cal = fit(pf.name, fp, scored, buckets=buckets, per_question=per_question)
    cal.notes = {
        "items": len(items),
        "buckets_used": buckets,
        "per_question_types": sorted(per_question),
        "raw": result["raw"],
        "held_out": best,
    }
    return cal, result


def total_log_loss(by_type: dict) -> float:
    return sum(v["log_loss"] for v in by_type.values())
