"""Metrics, temperature fitting, and calibration applied when serving (probabilities and confidence move)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from prefill.calibration import Calibration, fit_temperature, question_key, rescale
from prefill.engine import Engine
from prefill.evaluation import metrics
from prefill.schema import Choice, Noul
from prefill.serving.app import create_app

from .helpers import STATE, make_backend, make_model


def test_metrics_on_known_cases():
    perfect = [([1.0, 0.0], 0), ([0.0, 1.0], 1)]
    assert metrics.accuracy(perfect) == 1 and metrics.brier(perfect) == 0 and metrics.ece(perfect) == 0
    assert metrics.log_loss([([0.5, 0.5], 0)]) == pytest.approx(math.log(2))
    assert metrics.brier([([0.0, 1.0], 0)]) == 2
    one_off = metrics.ranked_probability_score([([0, 1, 0, 0], 0)])
    three_off = metrics.ranked_probability_score([([0, 0, 0, 1], 0)])
    assert 0 < one_off < three_off == 1
    assert metrics.mean_absolute_error([([0, 0.5, 0.5], 0)]) == 1.5
    assert metrics.macro_f1([([1, 0], 0), ([1, 0], 1)], [["a", "b"], ["a", "b"]]) == pytest.approx((2 / 3 + 0) / 2)
    overconfident = [([0.99, 0.01], i % 2) for i in range(100)]
    assert metrics.ece(overconfident) == pytest.approx(0.49)


@pytest.mark.parametrize("p", [[0.5, math.nan], [math.nan, math.nan], [math.inf, 0.0], [1.2, -0.2]])
def test_calibration_metrics_refuse_what_is_not_a_probability(p):
    with pytest.raises(ValueError, match="probabilities"):
        metrics.ece([([0.9, 0.1], 0), (p, 0)])
    with pytest.raises(ValueError, match="probabilities"):
        metrics.reliability([(p, 1)])


def test_ece_floor_is_what_a_calibrated_model_shows():
    rng = random.Random(0)
    preds = []
    for _ in range(400):
        p = rng.uniform(0.5, 1)
        preds.append(([p, 1 - p], 0 if rng.random() < p else 1))  # calibrated by construction
    floor = metrics.ece_floor(preds)
    assert 0 < floor < 0.08
    assert abs(metrics.ece(preds) - floor) < 0.05


def test_fit_recovers_the_temperature():
    rng = random.Random(1)
    truth = []
    for _ in range(2000):
        logits = [rng.gauss(0, 1.5) for _ in range(3)]
        p = rescale([math.exp(x) for x in logits], 1.0)
        gold = rng.choices(range(3), weights=p)[0]
        truth.append((rescale(p, 0.5), gold))  # an overconfident model: the right T is about 2
    t = fit_temperature(truth)
    assert 1.7 < t < 2.4
    assert metrics.log_loss([(rescale(p, t), g) for p, g in truth]) < metrics.log_loss(truth)


def test_calibration_file_is_tied_to_the_model(tmp_path):
    cal = Calibration("m", "a" * 64, {"noul": 2.0})
    cal.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json", "a" * 64).by_type == {"noul": 2.0}
    with pytest.raises(ValueError, match="fitted for model fingerprint"):
        Calibration.load(tmp_path / "c.json", "b" * 64)


def test_served_probabilities_follow_the_calibration(tokenizer):
    model = make_model("llama", len(tokenizer))
    raw = Engine(make_backend(model, tokenizer))
    hot = Engine(
        make_backend(model, tokenizer), calibration=Calibration("tiny", "", {"noul": 3.0, "choice": 3.0, "score": 0.5})
    )
    body = {
        "model": "jev-latest",
        "state": "I was charged twice.",
        "questions": {
            "r": {"type": "noul", "instructions": "Refund?"},
            "t": {"type": "choice", "criteria": {"Billing": None, "Technical": None, "Sales": None}},
            "a": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
        },
    }
    with TestClient(create_app(raw)) as c:
        a = c.post("/v1/systemone", json=body).json()["answers"]
    with TestClient(create_app(hot)) as c:
        b = c.post("/v1/systemone", json=body).json()["answers"]
    p_raw, p_hot = a["r"]["noul"], b["r"]["noul"]
    assert abs(p_hot - 0.5) < abs(p_raw - 0.5)  # T = 3 flattens towards 1/2
    assert b["r"]["noul"] == pytest.approx(rescale([p_raw, 1 - p_raw], 3.0)[0], abs=1e-9)
    assert b["t"]["confidence"] < a["t"]["confidence"] and b["t"]["choice"] == a["t"]["choice"]
    assert b["a"]["confidence"] >= a["a"]["confidence"]  # T = 0.5 sharpens


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "prefill.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_eval_and_calibrate_commands(model_dir, tmp_path):  # noqa: F811
    rows = []
    rng = random.Random(0)
    for i in range(12):
        rows.append(
            {
                "state": f"Ticket {i}: {'charged twice' if i % 2 else 'app crashes'}",
                "questions": {
                    "refund": {"type": "noul", "instructions": "Refund?"},
                    "team": {"type": "choice", "criteria": {"Billing": None, "Technical": None}},
                    "anger": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
                },
                "gold": {"refund": bool(i % 2), "team": "Billing" if i % 2 else "Technical", "anger": rng.randrange(3)},
            }
        )
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cal_file = tmp_path / "cal.json"
    run = run_cli("calibrate", str(data), "--model", str(model_dir), "--folds", "3", "--out", str(cal_file))
    assert run.returncode == 0, run.stderr[-2000:]
    fitted = json.loads(cal_file.read_text())
    assert set(fitted["temperatures"]["by_type"]) == {"noul", "choice", "score"}
    assert fitted["by_question"] == {}
    run = run_cli(
        "eval",
        str(data),
        "--model",
        str(model_dir),
        "--calibration",
        str(cal_file),
        "--folds",
        "3",
        "--generate",
        "--out",
        str(tmp_path / "ev"),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())
    for key in ("raw", "calibrated", "calibrated_cross_validated"):
        assert set(report[key]) == {"noul", "choice", "score"}
    assert {"accuracy", "macro_f1", "log_loss", "brier", "ece", "ece_floor", "rps", "mae"} <= set(
        report["raw"]["score"]
    )
    for qtype in ("choice", "score"):  # a temperature never moves the argmax
        assert report["calibrated"][qtype]["accuracy"] == report["raw"][qtype]["accuracy"]
    for qtype in ("noul", "choice", "score"):  # fitted on this very data: the log loss cannot get worse
        assert report["calibrated"][qtype]["log_loss"] <= report["raw"][qtype]["log_loss"] + 1e-6
    assert report["generate_and_parse"]["choice"]["n"] == 12
    assert (tmp_path / "ev" / "reliability.png").read_bytes()[:4] == b"\x89PNG"


def test_platt_recovers_a_lean_towards_yes():
    rng = random.Random(2)
    preds = []
    for _ in range(3000):
        x = rng.gauss(0, 2)  # the true yes-minus-no log odds
        gold = 0 if rng.random() < 1 / (1 + math.exp(-x)) else 1
        shown = x + 1.5  # a model that leans towards yes
        preds.append(([1 / (1 + math.exp(-shown)), 1 / (1 + math.exp(shown))], gold))
    from prefill.calibration import fit_platt

    t, b = fit_platt(preds)
    assert 0.85 < t < 1.2 and -1.8 < b < -1.2
    cal = Calibration("m", "", {"noul": t}, bias={"noul": b})
    assert metrics.ece([(cal.apply("noul", p), g) for p, g in preds]) < metrics.ece(preds) / 3


def leaning(rng: random.Random, n: int, lean: float) -> list:
    """Yes/no answers from a model that ranks well but adds `lean` to its yes-minus-no log odds."""
    preds = []
    for _ in range(n):
        x = rng.gauss(0, 2)
        gold = 0 if rng.random() < 1 / (1 + math.exp(-x)) else 1
        preds.append(([1 / (1 + math.exp(-(x + lean))), 1 / (1 + math.exp(x + lean))], gold))
    return preds


def test_each_question_gets_its_own_lean_undone():
    """Two questions leaning opposite ways (as "... negative?" and "... positive?" do on real reviews): one
    bias per type cannot undo both, one per question does, and each stays with its own question."""
    rng = random.Random(3)
    neg, pos = Noul("Is this review negative?"), Noul("Is this review positive?")
    rows = {question_key(neg): leaning(rng, 400, 2.0), question_key(pos): leaning(rng, 400, -2.0)}
    per_type = Calibration.fit("m", "", {"noul": [r for preds in rows.values() for r in preds]})
    own = Calibration.fit(
        "m",
        "",
        {"noul": [r for preds in rows.values() for r in preds]},
        by_question={k: ("noul", ["yes", "no"], v) for k, v in rows.items()},
    )
    b_neg, b_pos = (own.by_question[k]["bias"] for k in rows)
    assert b_neg["yes"] - b_neg["no"] < -1.5 and b_pos["yes"] - b_pos["no"] > 1.5
    for key, preds in rows.items():
        fixed = [(own.apply("noul", p, key, ["yes", "no"]), g) for p, g in preds]
        typed = [(per_type.apply("noul", p), g) for p, g in preds]
        assert metrics.accuracy(fixed) > metrics.accuracy(typed) + 0.1
        assert metrics.ece(fixed) < metrics.ece(typed) / 2
    unseen = [0.7, 0.3]  # a question it was not fitted on gets the type's calibration
    assert own.apply("noul", unseen, question_key(Noul("Spam?")), ["yes", "no"]) == per_type.apply("noul", unseen)
    assert len(own.by_question) == 2 and "by_question" in own.parameters()


def test_a_question_is_found_by_its_content_not_its_id_or_option_order(tokenizer, tmp_path):
    model = make_model("llama", len(tokenizer))
    team = Choice("Which team?", {"Billing": None, "Technical": None, "Sales": "new contracts"})
    reordered = Choice("Which team?", {"Sales": "new contracts", "Billing": None, "Technical": None})
    assert (
        question_key(team) == question_key(reordered) != question_key(Choice("Which team?", ["Billing", "Technical"]))
    )
    cal = Calibration("tiny", "", {"choice": 1.0, "noul": 1.0})
    cal.by_question[question_key(team)] = {
        "temperature": 0.5,
        "bias": {"Billing": -2.0, "Technical": 0.0, "Sales": 3.0},
    }
    cal.save(tmp_path / "c.json")
    cal = Calibration.load(tmp_path / "c.json")
    raw, hot = Engine(make_backend(model, tokenizer)), Engine(make_backend(model, tokenizer), calibration=cal)
    state, refund = "I was charged twice.", Noul("Refund?")
    before = raw.ask(state, {"t": team, "r": refund})[0]
    after = hot.ask(state, {"x": refund, "renamed": reordered, "t2": team})[0]
    expected = rescale([before["t"].probabilities[n] for n in team.criteria], 0.5)
    expected = [e * math.exp(b) for e, b in zip(expected, (-2.0, 0.0, 3.0))]
    for name, e in zip(team.criteria, expected):
        for qid in ("renamed", "t2"):  # any id, options in any order: the same answer
            assert after[qid].probabilities[name] == pytest.approx(e / sum(expected), abs=1e-5)
    assert after["t2"].choice == "Sales"
    assert after["x"].noul == pytest.approx(before["r"].noul, abs=1e-6)  # the other question: untouched
    alone = hot.ask(state, {"q": reordered})[0]["q"]
    assert alone.probabilities == pytest.approx(after["t2"].probabilities, abs=1e-5)  # T = 0.5 doubles 1e-6


@pytest.mark.slow
def test_calibrate_per_question_from_the_command_line(model_dir, tmp_path):  # noqa: F811
    """`--per-question` on rows where one question's answer is nearly always the same (a lean no temperature
    gives): kept because it does better out of fold, saved by question, and it moves that question's answers."""
    rows = [
        {
            "state": f"Ticket {i}: {'charged twice' if i % 2 else 'app crashes'}",
            "questions": {
                "team": {"type": "choice", "criteria": {"Billing": None, "Technical": None}},
                "refund": {"type": "noul", "instructions": "Refund?"},
            },
            "gold": {"team": "Technical" if i % 10 == 0 else "Billing", "refund": bool(i % 2)},
        }
        for i in range(30)  # 20 rows a question in each of 3 training folds: MIN_QUESTION_ROWS
    ]
    data, cal_file = tmp_path / "data.jsonl", tmp_path / "cal.json"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ("calibrate", str(data), "--model", str(model_dir), "--folds", "3", "--out", str(cal_file))
    run = run_cli(*args, "--per-question")
    assert run.returncode == 0, run.stderr[-2000:]
    result, fitted = json.loads(run.stdout), json.loads(cal_file.read_text())
    assert "choice" in fitted["notes"]["per_question_types"]  # kept for the type it helps out of fold
    held_type, held_question = result["held_out_per_type"]["choice"], result["held_out_per_question"]["choice"]
    assert held_question["log_loss"] < held_type["log_loss"]
    team = question_key(Choice(None, {"Technical": None, "Billing": None}))
    refund = question_key(Noul("Refund?"))
    assert set(fitted["by_question"]) == {team} | (
        {refund} if "noul" in fitted["notes"]["per_question_types"] else set()
    )
    assert fitted["by_question"][team]["bias"]["Billing"] > fitted["by_question"][team]["bias"]["Technical"]


def test_a_question_with_its_opposite_is_calibrated_as_one_question(tokenizer):
    """The calibration applies to the question read with its opposite, not to each of the two: a yes-bias
    survives (applied to each, the two would cancel it), and a question's own correction is found under the
    question with its opposite, which is another question than without it."""
    model = make_model("llama", len(tokenizer))
    paired = Noul("Is the customer asking for money back?", x_opposite="Is the customer happy?")
    plain = paired.alone()
    raw = Engine(make_backend(model, tokenizer)).probabilities(STATE, {"p": paired, "q": plain})[0]
    cal = Calibration("tiny", "-", by_type={"noul": 2.0}, bias={"noul": 0.7})
    got = Engine(make_backend(model, tokenizer), calibration=cal).probabilities(STATE, {"p": paired, "q": plain})[0]
    for qid in ("p", "q"):
        assert max(abs(a - b) for a, b in zip(got[qid], cal.apply("noul", raw[qid]))) < 1e-9
    own = {"temperature": 0.5, "bias": {"yes": -1.0, "no": 0.0}}
    cal.by_question = {question_key(paired): own}
    got = Engine(make_backend(model, tokenizer), calibration=cal).probabilities(STATE, {"p": paired, "q": plain})[0]
    assert (
        max(abs(a - b) for a, b in zip(got["p"], cal.apply("noul", raw["p"], question_key(paired), ["yes", "no"])))
        < 1e-9
    )
    assert max(abs(a - b) for a, b in zip(got["q"], cal.apply("noul", raw["q"]))) < 1e-9  # the plain one: its type's
    assert question_key(plain) != question_key(paired)


def test_a_reliability_diagram_is_drawn_with_matplotlib_and_skipped_without(tmp_path, monkeypatch, capsys):
    """matplotlib comes with the bench extra, not with prefill: `prefill eval` without it still writes its
    results, and says the diagram was not drawn (it once crashed where `make serve` had installed prefill)."""
    from prefill.evaluation.evaluate import LabelledAnswer, plot_reliability

    scored = [LabelledAnswer("noul", [p, 1 - p], int(p > 0.5), ["yes", "no"], i) for i, p in enumerate((0.2, 0.9, 0.6))]
    plot_reliability(scored, tmp_path / "drawn.png", "with matplotlib")
    assert (tmp_path / "drawn.png").stat().st_size > 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    plot_reliability(scored, tmp_path / "skipped.png", "without")
    assert not (tmp_path / "skipped.png").exists()
    assert "skipped.png not drawn: matplotlib is not installed" in capsys.readouterr().err
