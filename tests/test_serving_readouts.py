"""Trained heads in production: several heads and the base served by one process on one copy of the weights,
and fallbacks that speak over HTTP (another System One server; an OpenAI-compatible chat server)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from prefill.api import Prefill
from prefill.bench.http import free_port, in_thread, started
from prefill.engine import Engine, choice_confidence
from prefill.fallback import (
    UNSCORED_MASS,
    ChatFallback,
    SystemOneFallback,
    answer_distribution,
    answer_probability,
    failure_kind,
    is_unscored,
    parse_answer,
)
from prefill.heads import Heads
from prefill.schema import Noul
from prefill.scoring import with_opposite
from prefill.serving.app import Served, create_app

from .helpers import QUESTIONS, RAW, STATE, TOL, head, make_backend, make_model

WIRE = {k: q.model_dump(mode="json", exclude_none=True) for k, q in QUESTIONS.items()}


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    return make_model("llama", len(tokenizer))


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Two trained readouts saved as prefill train saves them: a linear head with an early-exit head, and
    a pointer head."""
    d = tmp_path_factory.mktemp("heads")
    one = head("linear", seed=1)
    early = head("linear", layer=1, use_base=False, seed=2)
    early.cfg.exit_threshold = 0.3
    one.save(d / "one" / "final.json")
    early.save(d / "one" / "early.json")
    head("pointer", seed=3).save(d / "two" / "final.json")
    return d


def wire(client: TestClient, model: str, questions=None) -> dict:
    r = client.post("/v1/systemone", json={"model": model, "state": STATE, "questions": questions or WIRE})
    assert r.status_code == 200, r.text
    return r.json()


def probabilities(answers: dict) -> dict:
    """Wire answers (or Answer objects) as {id: the probabilities they give}."""
    out = {}
    for k, a in answers.items():
        a = a if isinstance(a, dict) else a.model_dump(mode="json")
        out[k] = [a["noul"], 1 - a["noul"]] if a["type"] == "noul" else list(a["probabilities"].values())
    return out


def delta(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


def test_readouts_and_the_base_share_one_copy_of_the_weights(tiny_model, tokenizer, heads):
    pf = Prefill.from_backend(make_backend(tiny_model, tokenizer), use_facts=False, scoring=RAW)
    pf.add_readout(heads / "one", "router")
    pf.add_readout(heads / "two", "tone")
    assert list(pf.engines) == ["tiny", "router", "tone"]
    backends = {id(e.backend) for e in pf.engines.values()}
    params = {tuple(p.data_ptr() for p in e.backend.model.parameters()) for e in pf.engines.values()}
    assert len(backends) == 1 and len(params) == 1  # one model, one state cache
    client = TestClient(create_app(Served.of(pf.engines, default="router")))
    listed = [m["name"] for m in client.get("/v1/models").json()["models"]]
    assert listed == ["tiny", "router", "tone", "jev-latest", "jev-preview"]

    def alone(path=None) -> Engine:  # its own copy of the weights, its own state cache
        backend = make_backend(copy.deepcopy(tiny_model), tokenizer)
        return Engine(backend, use_facts=False, scoring=RAW, heads=Heads.load(path) if path else None)

    expected = {"tiny": alone(), "router": alone(heads / "one"), "tone": alone(heads / "two")}
    # interleaved, so each engine meets states the others cached
    for name in ["router", "tiny", "tone", "router", "tone", "tiny"]:
        got = wire(client, name)
        assert got["model"] == name
        assert delta(probabilities(got["answers"]), probabilities(expected[name].ask(STATE, QUESTIONS)[0])) <= TOL
    assert wire(client, "jev-latest")["model"] == "router"
    assert (
        delta(probabilities(wire(client, "router")["answers"]), probabilities(wire(client, "tone")["answers"])) > 1e-3
    )  # the heads really differ
    r = client.post("/v1/systemone", json={"model": "nope", "state": STATE, "questions": WIRE})
    assert r.status_code == 404 and r.json()["detail"]["error_type"] == "not_found_error"


def test_warm_up_asks_every_served_engine_never_the_fallback_and_moves_no_answer(
    tiny_model, tokenizer, heads, monkeypatch
):
    """What `prefill serve` runs before it says it is ready: each engine (the base and every readout) asked
    once, the fallback never (a remote one must not get a request at start-up), and afterwards every
    answer the same bits as from a process that did not warm up."""
    asked_fallback, warmed = [], []

    class Recording:
        def probabilities(self, state, questions, reference_date=None):
            asked_fallback.append(list(questions))
            return {}, 0, []

    pf = Prefill.from_backend(
        make_backend(tiny_model, tokenizer), use_facts=False, fallback=Recording(), fallback_below=1.0
    )
    pf.add_readout(heads / "one", "router")
    original = Engine.probabilities

    def recorded(self, *args, **kwargs):
        warmed.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "probabilities", recorded)
    passes = pf.backend.forward_calls
    assert pf.warm_up() > 0
    monkeypatch.undo()
    assert warmed == ["tiny", "router"] and pf.backend.forward_calls > passes and asked_fallback == []
    cold = Prefill.from_backend(make_backend(copy.deepcopy(tiny_model), tokenizer), use_facts=False)
    cold.add_readout(heads / "one", "router")
    for name in pf.engines:
        assert (
            pf.engines[name].probabilities(STATE, QUESTIONS)[0] == cold.engines[name].probabilities(STATE, QUESTIONS)[0]
        )
    small = Prefill.from_backend(make_backend(tiny_model, tokenizer), max_request_tokens=8)
    assert small.warm_up() >= 0  # a limit the made-up request is over: served requests meet it, start-up does not


def test_a_lora_readout_cannot_share_the_base(tiny_model, tokenizer, heads, tmp_path):
    lora = head("linear", seed=4)
    lora.cfg.adapter = "lora"
    lora.save(tmp_path / "final.json")
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text("{}")
    pf = Prefill.from_backend(make_backend(tiny_model, tokenizer), use_facts=False)
    with pytest.raises(ValueError, match="LoRA adapter changes the base model's weights"):
        pf.add_readout(tmp_path)
    with pytest.raises(ValueError, match="named"):  # two readouts that would be served under one name
        pf.add_readout(heads / "one", "x")
        pf.add_readout(heads / "two", "x")


def test_serve_refuses_a_lora_among_readouts_at_start_up(tmp_path, tokenizer, heads):
    model_dir = tmp_path / "model"
    make_model("llama", len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    lora = head("linear", seed=4)
    lora.cfg.adapter = "lora"
    lora.save(tmp_path / "lora-head" / "final.json")
    (tmp_path / "lora-head" / "lora").mkdir()
    (tmp_path / "lora-head" / "lora" / "adapter_config.json").write_text("{}")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "serve",
            "--model",
            str(model_dir),
            "--readout",
            f"a={tmp_path / 'lora-head'}",
            "--readout",
            f"b={heads / 'one'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "LoRA" in run.stderr and "Traceback" not in run.stderr


def test_serve_refuses_an_openai_fallback_without_its_model_name_at_start_up(tmp_path, tokenizer, capsys):
    from prefill.cli import main

    make_model("llama", len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    flags = ["--fallback-url", "http://127.0.0.1:9", "--fallback-kind", "openai"]
    assert main(["serve", "--model", str(tmp_path), *flags]) == 2
    assert "--fallback-model" in capsys.readouterr().err


# ---------------------------------------------------------------- fallbacks over HTTP


@contextlib.contextmanager
def silent_server():
    """Accepts connections and never answers: a fallback that hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_unsure_questions_go_to_a_second_prefill_server(tiny_model, tokenizer):
    strong = Engine(
        make_backend(copy.deepcopy(tiny_model), tokenizer),
        use_facts=False,
        heads=Heads(head("linear", seed=1)),
        served_as="strong",
    )
    local = Engine(make_backend(tiny_model, tokenizer), use_facts=False)
    mine, _ = local.ask(STATE, QUESTIONS)
    confidence = {k: choice_confidence(p) for k, p in probabilities(mine).items()}
    threshold = sorted(confidence.values())[len(confidence) // 2]  # about half are unsure
    unsure = sorted(k for k, c in confidence.items() if c < threshold)
    assert 0 < len(unsure) < len(QUESTIONS)
    with in_thread(create_app(strong)) as url:
        asking = Engine(
            make_backend(tiny_model, tokenizer),
            use_facts=False,
            fallback_below=threshold,
            fallback=SystemOneFallback(url, model="strong"),
        )
        client = TestClient(create_app(asking))
        got = wire(client, "tiny")
    assert sorted(got["x_escalated"]) == unsure and "x_low_confidence" not in got
    theirs, _ = strong.ask(STATE, {k: QUESTIONS[k] for k in unsure})
    answers = probabilities(got["answers"])
    assert delta({k: answers[k] for k in unsure}, probabilities(theirs)) <= 1e-6
    sure = [k for k in QUESTIONS if k not in unsure]  # the rest untouched
    assert delta({k: answers[k] for k in sure}, probabilities({k: mine[k] for k in sure})) <= 1e-6


@pytest.mark.parametrize("where", ["down", "slow", "unknown model"])
def test_a_failing_fallback_keeps_the_local_answers(tiny_model, tokenizer, where):
    local = Engine(make_backend(tiny_model, tokenizer), use_facts=False)
    mine = probabilities(local.ask(STATE, QUESTIONS)[0])
    with contextlib.ExitStack() as stack:
        if where == "down":
            url, model = f"http://127.0.0.1:{free_port()}", None
        elif where == "slow":
            url, model = stack.enter_context(silent_server()), None
        else:  # a server that answers 404
            url, model = stack.enter_context(in_thread(create_app(local))), "no-such-model"
        asking = Engine(
            make_backend(tiny_model, tokenizer),
            use_facts=False,
            fallback_below=1.01,
            fallback=SystemOneFallback(url, model=model, timeout=0.5),
        )
        started = time.monotonic()
        got = wire(TestClient(create_app(asking)), "tiny")
        assert time.monotonic() - started < 10
    assert sorted(got["x_low_confidence"]) == sorted(QUESTIONS) and "x_escalated" not in got
    assert delta(probabilities(got["answers"]), mine) <= 1e-6


def test_chat_replies_are_read_as_declared_answers():
    answers = ["Billing", "Technical", "Bill"]
    assert parse_answer('{"answer": "Technical"}', answers) == 1
    assert parse_answer("  billing.", answers) == 0
    assert parse_answer("- Billing: payments, invoices", answers) == 0  # the longest answer that starts it
    assert parse_answer("Technical support", answers) == 1
    assert parse_answer("I think it is Billing", answers) is None
    assert parse_answer("Yes", ["Yes", "No"]) == 0 and parse_answer("no", ["Yes", "No"]) == 1
    logprobs = {
        "content": [
            {"token": '{"', "logprob": 0.0},
            {"token": "answer", "logprob": 0.0},
            {"token": '": "', "logprob": 0.0},
            {"token": "Bill", "logprob": -0.1},
            {"token": "ing", "logprob": -0.2},
            {"token": '"}', "logprob": 0.0},
        ]
    }
    text = '{"answer": "Billing"}'
    assert abs(answer_probability(logprobs, text, "Billing") - torch.exp(torch.tensor(-0.3)).item()) < 1e-6
    assert answer_probability(None, text, "Billing") is None


def test_chat_top_logprobs_give_the_models_distribution_over_the_declared_answers():
    """As llama.cpp's server answered "Which language...?" for "Bonjour, comment vas-tu ?" under the JSON
    schema (the alternatives are the model's, before the grammar: it wanted "language" as the key)."""
    alternatives = [("French", -0.4), ("English", -1.31), ("Spanish", -4.19), ("F", -4.86), ("Fran", -6.1)]
    top = [{"token": t, "logprob": lp} for t, lp in alternatives]
    logprobs = {
        "content": [
            {"token": "{", "logprob": 0.0, "top_logprobs": [{"token": "{", "logprob": 0.0}]},
            {"token": '"', "logprob": 0.0, "top_logprobs": []},
            {"token": "answer", "logprob": -7.47, "top_logprobs": [{"token": "language", "logprob": -0.08}]},
            {"token": '": "', "logprob": 0.0, "top_logprobs": []},
            {"token": "French", "logprob": -0.4, "top_logprobs": top},
            {"token": '"}', "logprob": -0.02, "top_logprobs": []},
        ]
    }
    text, answers = '{"answer": "French"}', ["English", "French", "German", "Spanish"]
    got = answer_distribution(logprobs, text, answers, 1)
    e = math.exp
    seen = sum(e(lp) for _, lp in alternatives)
    mass = [e(-1.31), e(-0.4) + e(-4.86), min(e(-6.1), 1 - seen), e(-4.19)]  # "Fran" begins none; German unlisted
    assert max(abs(g - m / sum(mass)) for g, m in zip(got, mass)) < 1e-9
    assert got[1] > got[0] > got[3] > got[2] and abs(sum(got) - 1) < 1e-9
    # two answers that begin with the same token: the chosen one keeps its own path, the other what is left
    shared = {
        "content": [
            {
                "token": "Bill",
                "logprob": -0.1,
                "top_logprobs": [{"token": "Bill", "logprob": -0.1}, {"token": "Tech", "logprob": -2.5}],
            },
            {"token": "ing", "logprob": -0.2, "top_logprobs": []},
        ]
    }
    got = answer_distribution(shared, "Billing", ["Billing", "Bill", "Technical"], 0)
    mass = [e(-0.3), e(-0.1) - e(-0.3), e(-2.5)]
    assert max(abs(g - m / sum(mass)) for g, m in zip(got, mass)) < 1e-9
    assert answer_distribution({"content": [{"token": "Billing", "logprob": -0.1}]}, "Billing", answers, 0) is None


def test_a_chat_fallback_asks_a_question_and_its_opposite_and_reads_them_together():
    """`x_opposite` reaches a chat server as two requests, the question and its opposite (what counts as yes
    and no swapped), answered as prefill answers it: the two read together. If the opposite has no answer,
    neither has the question, and no internal id leaks out."""
    said = {"Is this review positive?": -0.3, "Is this review negative?": -0.9}  # log P(Yes) for each
    asked: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["messages"][1]["content"]
        asked.append(prompt)
        lp = next((v for q, v in said.items() if q in prompt), None)
        if lp is None:
            return httpx.Response(200, json={"choices": [{"message": {"content": "Perhaps"}}]})
        yes, no = {"token": "Yes", "logprob": lp}, {"token": "No", "logprob": math.log(1 - math.exp(lp))}
        logprobs = {"content": [{**yes, "top_logprobs": [yes, no]}]}
        return httpx.Response(200, json={"choices": [{"message": {"content": "Yes"}, "logprobs": logprobs}]})

    chat = ChatFallback("http://teacher", model="m")
    chat.client = httpx.Client(transport=httpx.MockTransport(reply))
    crit = {"true": "praise", "false": "complaints"}
    positive = Noul("Is this review positive?", crit, x_opposite="Is this review negative?")
    questions = {
        "paired": positive,
        "alone": positive.alone(),
        "unanswered opposite": Noul("Is this review positive?", x_opposite="Is the reviewer a bot?"),
    }
    out, _, failed = chat.answers("Great phone.", questions)
    assert len(asked) == 5  # each question, and each one's opposite
    assert sum("Is this review negative?" in p and "Yes means: complaints" in p for p in asked) == 1
    p_yes, p_opposite = math.exp(-0.3), math.exp(-0.9)
    assert abs(out["alone"][0] - p_yes) < 1e-9
    assert abs(out["paired"][0] - with_opposite(p_yes, p_opposite)) < 1e-9 and abs(sum(out["paired"]) - 1) < 1e-12
    assert abs(out["paired"][0] - out["alone"][0]) > 0.05
    assert set(out) == {"paired", "alone"} and set(failed) == {"unanswered opposite"}
    assert failure_kind(failed["unanswered opposite"]) == "unparseable"


@pytest.fixture(scope="module")
def chat_server():
    """transformers' own OpenAI-compatible server (`transformers serve`, installed with prefill's pins)
    on SmolLM2-135M-Instruct, converted from the wheel's GGUF as prefill loads it."""
    from prefill import loading

    model_dir = str(loading._converted_gguf(loading.embedded_gguf(loading.SMOLLM2)))
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    url = f"http://127.0.0.1:{port}"
    with started(
        [exe, "serve", "--port", str(port), "--device", "cpu", model_dir],
        url,
        "/v1/models",
        {**os.environ, "HF_HUB_OFFLINE": "1"},
        within=180,
    ):
        yield url, model_dir


@pytest.mark.slow
def test_an_openai_compatible_server_answers_the_unsure_questions(tiny_model, tokenizer, chat_server):
    url, model = chat_server
    state = "I was charged twice for my March invoice and I want my money back."
    questions = {k: QUESTIONS[k] for k in ("refund", "team", "anger")}
    chat = ChatFallback(url, model=model, timeout=60)
    local = Engine(make_backend(tiny_model, tokenizer), use_facts=False, fallback_below=1.01, fallback=chat)
    d = local.decide(state, questions)
    assert sorted(d.escalated + d.low_confidence) == sorted(questions)
    assert d.escalated, "SmolLM2 answered none of the questions with a declared answer"
    for qid in d.escalated:  # transformers serve returns no logprobs: the documented smoothing
        a = d.answers[qid]
        p = [a.noul, 1 - a.noul] if a.type == "noul" else list(a.probabilities.values())
        assert abs(max(p) - (1 - UNSCORED_MASS)) < 1e-9 and abs(sum(p) - 1) < 1e-9 and is_unscored(p)
    assert chat.schema_ok is True  # the server ignores response_format rather than refusing it


@pytest.mark.slow
def test_prefill_serve_serves_named_readouts_beside_the_base(tmp_path, tokenizer):
    """The CLI path: `prefill serve --readout NAME=DIR ...` on a local model directory."""
    from prefill import loading

    model_dir = tmp_path / "model"
    make_model("llama", len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    fingerprint = loading.fingerprint(loading.resolve(str(model_dir)))
    for name, seed in (("one", 1), ("two", 2)):
        h = head("linear", seed=seed)
        h.cfg.fingerprint = fingerprint
        h.save(tmp_path / name / "final.json")
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "prefill.cli",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--readout",
        f"router={tmp_path / 'one'}",
        "--readout",
        f"tone={tmp_path / 'two'}",
        "--default-model",
        "tone",
    ]
    url = f"http://127.0.0.1:{port}"
    with started(cmd, url, within=180):
        names = [m["name"] for m in httpx.get(url + "/v1/models").json()["models"]]
        base = names[0]
        assert names == [base, "router", "tone", "jev-latest", "jev-preview"]
        body = {"model": "jev-latest", "state": STATE, "questions": WIRE}
        assert httpx.post(url + "/v1/systemone", json=body, timeout=60).json()["model"] == "tone"
        assert httpx.post(url + "/v1/systemone", json=body | {"model": "other"}, timeout=60).status_code == 404
