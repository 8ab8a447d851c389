"""The encoder route (backends/encoder.py): a tiny random BERT built here, with all-MiniLM-L6-v2's
tokenizer, for exactness (questions isolated, option order and ids irrelevant, 255 options, long states cut
and reported, questions too long refused), and all-MiniLM-L6-v2 itself behind `prefill serve` for the
conformance suite."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from benchmarks.load import server
from prefill.api import Prefill
from prefill.backends.encoder import EncoderBackend
from prefill.engine import Engine, RequestTooLarge
from prefill.loading import resolve
from prefill.schema import Choice, Noul, Score
from prefill.scoring import Scoring

TOL = 1e-4
TICKET = "I was charged twice for order 4471 and the refund never came. Fix it today."
WHOLE = dict.fromkeys(("noul", "choice", "score"), Scoring("whole"))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("all-minilm-l6-v2").location)


@pytest.fixture(scope="module")
def engine(tokenizer) -> Engine:
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, max_position_embeddings=512, initializer_range=0.3))
    return Engine(EncoderBackend(bert.float(), tokenizer, "tiny-bert", batch_size=4), scoring=WHOLE)


def probs(engine: Engine, questions: dict, state: str = TICKET) -> dict:
    answers, _ = engine.ask(state, questions)
    return {k: a.model_dump(mode="json") for k, a in answers.items()}


def dist(answer: dict) -> dict:
    return answer.get("probabilities") or {"yes": answer["noul"]}


def gap(a: dict, b: dict) -> float:
    return max(abs(dist(a)[k] - dist(b)[k]) for k in dist(a))


QUESTIONS = {
    "refund": Noul("Does the customer want money back?"),
    "team": Choice("Which team?", {"Billing": "invoices and refunds", "Technical": None, "Shipping": "parcels"}),
    "anger": Score("How angry is the customer?", ["Calm", "Annoyed", "Furious"]),
    "kind": Choice("What kind of case?", ["fraud", "fraud review", "billing error"]),
}


def test_questions_are_isolated_and_ids_do_not_matter(engine):
    together = probs(engine, QUESTIONS)
    for qid, q in QUESTIONS.items():
        alone = probs(engine, {"renamed-" + qid: q})["renamed-" + qid]
        assert gap(together[qid], alone) <= TOL
    reordered = probs(engine, dict(reversed(list(QUESTIONS.items()))))
    assert all(gap(together[k], reordered[k]) <= TOL for k in QUESTIONS)


def test_option_order_cannot_move_a_probability(engine):
    names = ["Billing", "Technical", "Shipping", "Sales", "Legal"]
    base = probs(engine, {"q": Choice("Which team?", names)})["q"]["probabilities"]
    for order in (names[::-1], names[2:] + names[:2]):
        moved = probs(engine, {"q": Choice("Which team?", order)})["q"]["probabilities"]
        assert max(abs(moved[n] - base[n]) for n in names) <= TOL
    assert len(set(base.values())) == len(names)  # not trivially uniform


def test_score_levels_keep_their_order_in_the_layout(engine):
    q = engine.backend.renderer.question(Score("How angry?", ["Very angry", "Calm", "Annoyed"]))
    [(order, _)] = engine.backend.layout(10, q)
    assert order == [0, 1, 2]
    c = engine.backend.renderer.question(Choice("Which?", ["b", "c", "a"]))
    [(order, _)] = engine.backend.layout(10, c)
    assert [c.answers[i] for i in order] == sorted(c.answers)


def test_255_options_are_answered_in_split_groups(engine):
    names = [f"option number {i}" for i in range(255)]
    q = Choice("Which option fits?", names)
    groups = engine.backend.layout(len(engine.backend.renderer.state(TICKET)), engine.backend.renderer.question(q))
    assert len(groups) > 1 and sorted(i for g, _ in groups for i in g) == list(range(255))
    answer = probs(engine, {"q": q})["q"]
    assert set(answer["probabilities"]) == set(names)
    assert abs(sum(answer["probabilities"].values()) - 1) < 1e-9


def test_a_long_state_is_cut_and_reported(engine):
    long_state = " ".join(["The parcel arrived late and the box was damaged."] * 120)  # ~1,300 tokens
    decision = engine.decide(long_state, QUESTIONS)
    assert sorted(decision.truncated) == sorted(QUESTIONS)
    assert engine.decide(TICKET, QUESTIONS).truncated == []
    # the state keeps its beginning: cutting the end off by hand changes nothing
    kept = engine.backend.layout(len(engine.backend.renderer.state(long_state)),
                                 engine.backend.renderer.question(QUESTIONS["refund"]))[0][1]
    head = engine.backend.renderer.tokenizer.decode(engine.backend.renderer.state(long_state)[:kept])
    assert gap(probs(engine, {"r": QUESTIONS["refund"]}, long_state)["r"],
               probs(engine, {"r": QUESTIONS["refund"]}, head)["r"]) <= 1e-3


def test_a_question_too_long_for_the_positions_is_refused(engine):
    with pytest.raises(RequestTooLarge):
        engine.ask(TICKET, {"q": Noul("Is this true? " * 300)})


def test_the_encoder_route_is_found_by_the_model_type():
    pf = Prefill("all-minilm-l6-v2", calibration=None)
    assert isinstance(pf.backend, EncoderBackend)
    answer = pf.ask(TICKET, Choice("Which team?", ["Billing", "Technical"]))
    assert abs(sum(answer.probabilities.values()) - 1) < 1e-9


@pytest.mark.parametrize("argv, reason", [
    (["ask", "--model", "all-minilm-l6-v2", "--route", "encoder", "--backend", "vllm", "--state", "x",
      "--questions", "{}"], "torch backend only"),
    (["ask", "--model", "all-minilm-l6-v2", "--state", "x", "--scoring", "choice=first",
      "--questions", '{"q": {"type": "noul"}}'], "whole options")])
def test_what_the_encoder_route_cannot_do_is_refused(argv, reason):
    run = subprocess.run([sys.executable, "-m", "prefill.cli", *argv], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and reason in run.stderr, run.stderr[-2000:]


def test_jevcompat_conformance_on_the_encoder_route(tmp_path: Path):
    with server("all-minilm-l6-v2", "--calibration", "none") as (url, _):
        report = tmp_path / "report.json"
        run = subprocess.run([sys.executable, "-m", "jevcompat.cli", "test", url, "--json", str(report)],
                             capture_output=True, text=True, timeout=900)
        long_state = httpx.post(url + "/v1/systemone", timeout=120, json={
            "model": "jev-latest", "state": "word " * 2000,
            "questions": {"q": {"type": "noul", "instructions": "Is this repetitive?"}}}).json()
    results = json.loads(report.read_text())["results"]
    untested = ("auth.bearer", "auth.missing", "auth.invalid")  # no key set
    assert not [r["id"] for r in results if r["status"] != "pass" and r["id"] not in untested], run.stdout[-4000:]
    assert long_state["x_truncated"] == ["q"]


def labelled(n: int, seed: int) -> list[dict]:
    """Support messages, gold yes when the customer wants money back (a rule, worded many ways)."""
    import random
    rng = random.Random(seed)
    money = ["Please refund my order", "I want my money back for order", "Return the payment for order",
             "Reimburse me for order", "Cancel and refund order"]
    other = ["Where is my parcel for order", "How do I change the address on order", "The app crashes after order",
             "Can I add a gift note to order", "Thanks, I love what came in order"]
    out = []
    for i in range(n):
        yes = i % 2 == 0
        text = f"{rng.choice(money if yes else other)} {rng.randint(1000, 9999)}, {rng.choice(['today', 'please', 'asap', 'thanks'])}."
        out.append({"state": text, "questions": {"refund": {"type": "noul", "instructions": "Does the customer want "
                                                                                           "money back?"}},
                    "gold": {"refund": yes}})
    return out


def test_a_head_trained_on_the_encoder_route_is_served(tmp_path: Path):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in labelled(60, seed=1)))
    out = tmp_path / "head"
    run = subprocess.run([sys.executable, "-m", "prefill.cli", "train", str(data), "--model", "all-minilm-l6-v2",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (out / "early.json").exists()
    pf = Prefill("all-minilm-l6-v2", readout=str(out), calibration=None)
    held = labelled(20, seed=2)
    right = sum((pf.ask(r["state"], Noul(r["questions"]["refund"]["instructions"])).noul > 0.5) == r["gold"]["refund"]
                for r in held)
    assert right >= 18, right
    refused = subprocess.run([sys.executable, "-m", "prefill.cli", "train", str(data), "--model", "all-minilm-l6-v2",
                              "--kind", "lora", "--out", str(tmp_path / "lora")], capture_output=True, text=True,
                             timeout=600)
    assert refused.returncode == 2 and "encoder route" in refused.stderr
