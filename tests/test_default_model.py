"""On the embedded default model (offline): invariances, exact options, the shipped calibration, obvious real
reviews answered the right way round, a live server that passes the jevcompat conformance suite with and
without keys, and the official SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefill.bench.http import served
from prefill.bench.measure import BROKEN, NEWCOMER, THANKS, TICKET
from prefill.bench.measure import TICKET_QUESTIONS as QUESTIONS
from prefill.schema import Choice

pytestmark = pytest.mark.default_model
# The tests run the default in fp32 (conftest: PREFILL_DTYPE), the reference, which is not exact: its answers move by
# up to ~3e-6 packed vs alone (docs/models-and-precision.md#exact-answers); bf16 and int8 are held to the bit by
# tests/test_precision.py, and on the 1.5B by benchmarks/speed/fastpath.py --exact.
TOL = 1e-5


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
    batched = default_prefill.engine.decide_many([(BROKEN, QUESTIONS, None), (TICKET, QUESTIONS, None)])[1]
    for qid in QUESTIONS:  # batched with another request's state and questions, or asked alone
        assert max(abs(x - y) for x, y in zip(flat(batched.answers[qid]), flat(together[qid]))) <= TOL


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
    is not asserted: the 0.5B model's numbered levels barely move with the text on that question;
    docs/measurements/real-text.md.)"""
    a = default_prefill.ask(TICKET, QUESTIONS)
    assert a["team"].choice == "Billing"
    assert a["refund"].noul > 0.5


def shipped_calibration(pf):
    from prefill.calibration import find_calibration, setup

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
    from prefill.calibration import T_MAX, T_MIN

    cal = shipped_calibration(default_prefill)
    assert set(cal.by_type) == {"noul", "choice", "score"}
    assert all(T_MIN * 1.5 < t < T_MAX / 1.5 for t in [*cal.by_type.values(), *cal.by_bucket.values()])
    assert not any(cal.bias.values())


# ---------------------------------------------------------------- a newcomer's first questions


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


# ---------------------------------------------------------------- a live server


@pytest.fixture(scope="module", params=[None, "test-key-1"], ids=["no-key", "key"])
def server(request, default_prefill):
    """`prefill serve` on the default model in the suite's precision (PREFILL_DTYPE=float32, so the fp32 default),
    with and without an API key."""
    with served(None, *(["--api-key", request.param] if request.param else []), within=300) as (url, _):
        yield url, request.param


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
