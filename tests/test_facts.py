"""The fact pass: exact answers for single numeric and date comparisons, abstention everywhere else, and
no effect at all on questions it abstains on."""

from __future__ import annotations

import datetime as dt

import pytest
from fastapi.testclient import TestClient

from prefill.engine import Engine
from prefill.facts import decide, quantities, reference_date
from prefill.schema import Choice, Noul, Score
from prefill.serving.app import create_app

from .helpers import TOL, make_backend, max_delta

STATE = (
    "Payment of $1,523.40 made on 2026-03-14 by Priya. The account was opened on December 1, 2025. "
    "Previous payment: $80. 3 failed login attempts from web-01. Late fee: 2.5% per month. "
    "Invoice due on 18 March 2026. Today is 2026-03-20."
)


def yes(text: str, state: str = STATE, today: dt.date | None = None) -> bool | None:
    probs = decide(state, Noul(text), today)
    return None if probs is None else probs == [1.0, 0.0]


def test_quantities_are_typed_and_normalised():
    found = {
        (q.kind, round(q.value, 2)) for q in quantities("$2.5k, 1,200 USD, 45%, 3 weeks, 2 hours, 7 seats, web-01")
    }
    assert found == {
        ("money", 2500.0),
        ("money", 1200.0),
        ("percent", 45.0),
        ("duration", 21.0),
        ("duration", round(2 / 24, 2)),
        ("count", 7.0),
    }
    assert reference_date(STATE)[0] == dt.date(2026, 3, 20)


@pytest.mark.parametrize(
    "question, truth",
    [
        ("Is the payment amount at least $1,000?", True),
        ("Is the payment amount over $1,523.40?", False),  # the boundary: strictly over
        ("Is the payment amount at least $1,523.40?", True),
        ("Is the payment amount not over $1,000?", False),
        ("Is the payment amount between $1,000 and $2,000?", True),
        ("Was the previous payment under $100?", True),  # the right amount of two
        ("Were there more than 2 failed login attempts?", True),
        ("Were there 4 or more failed login attempts?", False),
        ("Is the late fee above 2%?", True),
        ("Was the account opened more than 90 days ago?", True),  # 109 days before the state's today
        ("Was the payment made within the last 7 days?", True),
        ("Was the payment made before 2026-03-14?", False),
        ("Is the invoice due on or before March 18, 2026?", True),
    ],
)
def test_single_comparisons_are_exact(question, truth):
    assert yes(question) is truth


@pytest.mark.parametrize(
    "question",
    [
        "Is the customer angry?",  # no number
        "Is the payment amount over $1,000 and was it made by card?",  # two clauses
        "Is the refund under review?",  # "under" but no threshold
        "Is the amount over 1000?" + " Also mention the fee.",  # still one comparison, but...
    ],
)
def test_abstains_unless_sure(question):
    if "Also" in question:
        # "amount" alone fits both payments equally: the pass must not guess
        assert yes(question, "Payment one: $1,500. Payment two: $800.") is None
    else:
        assert yes(question) is None


def test_a_given_reference_date_wins_over_the_state():
    assert yes("Was the payment made within the last 7 days?") is True
    assert yes("Was the payment made within the last 7 days?", today=dt.date(2026, 4, 1)) is False
    assert yes("Was the payment made within the last 7 days?", state="Payment made on 2026-03-14.") is None


def test_ranges_as_choice_options_and_score_levels():
    bands = Choice(
        "Which size band is the payment amount in?",
        {"small": "under $100", "medium": "$100 to $1,000", "large": "over $1,000"},
    )
    assert decide(STATE, bands) == [0.0, 0.0, 1.0]
    levels = Score("How big is the payment amount?", ["under $500", "$500 to $1,500", "over $1,500"])
    assert decide(STATE, levels) == [0.0, 0.0, 1.0]
    assert decide(STATE, Choice("Which team?", ["Billing", "Fraud"])) is None
    overlapping = Choice("Payment amount?", ["over $100", "over $1,000"])  # both true: not one answer
    assert decide(STATE, overlapping) is None


def test_engine_answers_decided_questions_without_the_model(tiny_model, tokenizer):
    engine = Engine(make_backend(tiny_model, tokenizer))
    off = Engine(make_backend(tiny_model, tokenizer), use_facts=False)
    questions = {
        "big": Noul("Is the payment amount at least $1,000?"),
        "angry": Noul("Is Priya angry?"),
        "team": Choice("Which team?", ["Billing", "Fraud"]),
    }
    answers, usage = engine.ask(STATE, questions)
    plain, plain_usage = off.ask(STATE, questions)
    assert answers["big"].noul == 1.0 and plain["big"].noul not in (0.0, 1.0)
    # untouched: the same model answers (to float rounding: the packed pass holds one question fewer)
    assert max_delta({k: answers[k] for k in ("angry", "team")}, plain) <= TOL
    assert usage.input_tokens < plain_usage.input_tokens  # the decided question never reached the model
    before = engine.backend.forward_calls
    only_facts, usage = engine.ask(STATE, {"big": questions["big"]})
    assert engine.backend.forward_calls == before and usage.input_tokens == 0
    alone = {qid: engine.ask(STATE, {qid: q})[0][qid] for qid, q in questions.items()}
    assert max_delta(alone, answers) <= TOL  # packed or alone, the same


def test_x_reference_date_on_the_wire(tiny_model, tokenizer):
    client = TestClient(create_app(Engine(make_backend(tiny_model, tokenizer))))
    req = {
        "model": "jev-latest",
        "state": "Order placed on 2026-03-14.",
        "questions": {"recent": {"type": "noul", "instructions": "Was the order placed within the last 7 days?"}},
    }
    assert (
        client.post("/v1/systemone", json={**req, "x_reference_date": "2026-03-16"}).json()["answers"]["recent"]["noul"]
        == 1.0
    )
    assert (
        client.post("/v1/systemone", json={**req, "x_reference_date": "2026-05-01"}).json()["answers"]["recent"]["noul"]
        == 0.0
    )
    assert client.post("/v1/systemone", json={**req, "x_reference_date": "not a date"}).status_code == 422
