"""The language of a sentence: eld 1.0.6 (Apache-2.0), its benchmark file `eld/tests/data/big-test.txt`: 1,000
sentences in each of 60 languages (Wikipedia-style prose). Eight languages are read, sentences of 20-160
characters."""

from __future__ import annotations

import zipfile

from benchmarks.data.common import package_file

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
