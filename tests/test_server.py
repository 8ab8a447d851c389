"""The HTTP contract, on a tiny model: shapes, errors (4xx, never 5xx), auth, limits, encodings."""

from __future__ import annotations

import gzip
import json
import time

import pytest
from fastapi.testclient import TestClient

from prefill.engine import Engine
from prefill.serving.app import create_app

from .helpers import CHOICE, NOUL, SCORE, body, make_backend, make_model


@pytest.fixture(scope="module")
def tiny_model(tokenizer):  # the HTTP layer is model-agnostic: one architecture is enough here
    return make_model("llama", len(tokenizer))


@pytest.fixture
def engine(tiny_model, tokenizer):
    return Engine(make_backend(tiny_model, tokenizer))


@pytest.fixture
def client(engine):
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:
        yield c


def test_answers_every_type(client):
    r = client.post("/v1/systemone", json=body({"r": NOUL, "t": CHOICE, "a": SCORE}, x_trace="ignored"))
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["model"] == "tiny" and set(data["answers"]) == {"r", "t", "a"}
    assert 0 <= data["answers"]["r"]["noul"] <= 1
    t = data["answers"]["t"]
    assert list(t["probabilities"]) == list(CHOICE["criteria"]) and t["choice"] in CHOICE["criteria"]
    a = data["answers"]["a"]
    assert a["legend"] == {"0": "Calm", "1": {"label": "Annoyed"}, "2": ["Very", "angry"]}
    assert abs(a["score"] - sum(int(k) * p for k, p in a["probabilities"].items())) < 1e-9
    assert isinstance(data["usage"]["input_tokens"], int) and data["usage"]["input_tokens"] > 0


def test_a_yes_no_question_with_its_opposite(client):
    """`x_opposite` (prefill's extension): one answer under the question's own id, read with its opposite
    (as `with_opposite` reads the two asked apart), its tokens counted; the opposite's id never shows."""
    from prefill import with_opposite

    opposite = "Is the customer happy with the refund?"
    apart = client.post("/v1/systemone", json=body({"r": NOUL, "o": {"type": "noul", "instructions": opposite}}))
    paired = client.post("/v1/systemone", json=body({"r": {**NOUL, "x_opposite": opposite}}))
    alone = client.post("/v1/systemone", json=body({"r": NOUL}))
    assert apart.status_code == paired.status_code == alone.status_code == 200, paired.text
    a = apart.json()["answers"]
    assert list(paired.json()["answers"]) == ["r"]
    assert abs(paired.json()["answers"]["r"]["noul"] - with_opposite(a["r"]["noul"], a["o"]["noul"])) < 1e-6
    assert paired.json()["answers"]["r"]["noul"] != alone.json()["answers"]["r"]["noul"]
    tokens = [r.json()["usage"]["input_tokens"] for r in (apart, paired, alone)]
    assert tokens[0] == tokens[1] > tokens[2]


def test_state_forms(client):
    for state in ["text", {"subject": "x", "body": {"a": [1, 2]}}, ["a", "b"]]:
        assert client.post("/v1/systemone", json={**body({"r": NOUL}), "state": state}).status_code == 200


def test_models_and_health(client):
    models = client.get("/v1/models").json()["models"]
    assert [m["name"] for m in models] == ["tiny", "jev-latest", "jev-preview"]
    assert all(m["release_date"] == "2026-11-29" for m in models)
    assert client.get("/health").json() == {"status": "ok", "model": "tiny", "models": ["tiny"]}


@pytest.mark.parametrize(
    "bad",
    [
        {"model": "jev-latest", "questions": {"r": NOUL}},  # no state
        body({}),  # no questions
        body({"r": {"instructions": "x"}}),  # no type
        body({"r": {"type": "boolean", "instructions": "x"}}),  # unknown type
        body({"t": {"type": "choice", "criteria": {"only": None}}}),  # 1 option
        body({"t": {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}}),  # 256 options
        body({"t": {"type": "choice", "criteria": {"": None, "b": None}}}),  # empty option name
        body({"a": {"type": "score", "criteria": ["one"]}}),  # 1 level
        body({"a": {"type": "score", "criteria": [str(i) for i in range(11)]}}),  # 11 levels
        body({"a": {"type": "score", "criteria": {"0": "calm", "1": "angry"}}}),  # map form
        body({"a": {"type": "score", "criteria": ["calm", None]}}),  # null level
        body({"r": {"type": "noul", "criteria": {"maybe": "x"}}}),  # unknown noul side
        body({"r": {"type": "noul", "instructions": 5}}),  # a number is not text
        body({"": NOUL}),  # empty id
        body({"t": {**CHOICE, "x_opposite": "Which team not?"}}),  # a choice has no opposite
        body({"a": {**SCORE, "x_opposite": "How calm?"}}),  # nor a score
        body({"r": {**NOUL, "x_opposite": " "}}),  # an empty opposite
        body({"r": {**NOUL, "x_opposite": NOUL["instructions"]}}),  # the question itself
        {**body({"r": NOUL}), "state": None},
        {**body({"r": NOUL}), "state": 12},
        [1, 2, 3],
    ],
)
def test_invalid_requests_get_422_detail_list(client, bad):
    r = client.post("/v1/systemone", json=bad)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and all({"loc", "msg", "type"} <= set(d) for d in detail)


def test_malformed_json_is_422(client):
    r = client.post(
        "/v1/systemone", content=b'{"model": "jev-latest", "state": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


def test_deep_nesting_is_not_a_5xx(client):
    deep = "[" * 5000 + "]" * 5000
    r = client.post(
        "/v1/systemone",
        content=('{"model":"jev-latest","state":' + deep + ',"questions":{"r":{"type":"noul"}}}').encode(),
        headers={"content-type": "application/json"},
    )
    assert 400 <= r.status_code < 500


def test_unknown_model_is_404_with_error_shape(client):
    r = client.post("/v1/systemone", json={**body({"r": NOUL}), "model": "gpt-9"})
    assert r.status_code == 404
    assert r.json()["detail"]["error_type"] == "not_found_error" and "gpt-9" in r.json()["detail"]["message"]


def test_unknown_route_has_error_shape(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and set(r.json()["detail"]) == {"error_type", "message"}


def test_over_the_token_limit_is_413_naming_the_limit(tiny_model, tokenizer):
    engine = Engine(make_backend(tiny_model, tokenizer), max_request_tokens=200)
    with TestClient(create_app(engine)) as c:
        r = c.post("/v1/systemone", json=body({"r": NOUL, "t": CHOICE}))
    assert r.status_code == 413
    assert r.json()["detail"]["error_type"] == "request_too_large" and "200" in r.json()["detail"]["message"]


def test_the_documented_limits_are_the_defaults(client):
    """64k tokens a request, 32k for the state plus its longest question: over either is a 413 naming it."""
    long_option = "a long description of this option " * 20
    many = {
        f"q{i}": {"type": "choice", "instructions": f"Question {i}?", "criteria": {"A": long_option, "B": None}}
        for i in range(400)
    }
    r = client.post("/v1/systemone", json=body(many))
    assert r.status_code == 413 and "65536" in r.json()["detail"]["message"]


def test_over_the_sequence_limit_is_413(tiny_model, tokenizer):
    with TestClient(create_app(Engine(make_backend(tiny_model, tokenizer), max_sequence_tokens=300))) as c:
        r = c.post("/v1/systemone", json={**body({"r": NOUL}), "state": "refund " * 400})
        fine = c.post("/v1/systemone", json=body({"r": NOUL}))
    assert r.status_code == 413 and "--max-sequence-tokens" in r.json()["detail"]["message"]
    assert fine.status_code == 200


def test_choice_criteria_on_the_wire_is_an_object(client):
    """The Python API's list shorthand is not the wire format: the API documents an object. The error shows
    the object to send instead, from the caller's own names."""
    r = client.post("/v1/systemone", json=body({"t": {"type": "choice", "criteria": ["Billing", "Technical"]}}))
    assert r.status_code == 422 and "object" in r.json()["detail"][0]["msg"]
    assert 'e.g. {"Billing": null, "Technical": null}' in r.json()["detail"][0]["msg"]


def test_over_the_context_is_413(client):
    r = client.post("/v1/systemone", json={**body({"r": NOUL}), "state": "refund " * 20000})
    assert r.status_code == 413 and "context" in r.json()["detail"]["message"]


def test_auth(engine):
    with TestClient(create_app(engine, api_keys=["k1", "k2"])) as c:
        missing = c.post("/v1/systemone", json=body({"r": NOUL}))
        wrong = c.post("/v1/systemone", json=body({"r": NOUL}), headers={"Authorization": "Bearer nope"})
        ok = c.post("/v1/systemone", json=body({"r": NOUL}), headers={"Authorization": "Bearer k2"})
        models_without = c.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["detail"]["error_type"] == "authentication_error"
    assert wrong.status_code == 401 and wrong.json()["detail"]["error_type"] == "authentication_error"
    assert ok.status_code == 200
    assert models_without.status_code == 401


def test_auth_off_accepts_any_authorization_header(client):
    r = client.post("/v1/systemone", json=body({"r": NOUL}), headers={"Authorization": "Bearer whatever"})
    assert r.status_code == 200


def test_compressed_bodies(client):
    from backports import zstd

    raw = json.dumps(body({"r": NOUL})).encode()
    plain = client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"}).json()
    for encoding, data in [("zstd", zstd.compress(raw)), ("gzip", gzip.compress(raw))]:
        r = client.post(
            "/v1/systemone", content=data, headers={"content-type": "application/json", "content-encoding": encoding}
        )
        assert r.status_code == 200, r.text
        assert r.json() == plain
    assert client.post("/v1/systemone", content=raw, headers={"content-encoding": "br"}).status_code == 415
    assert client.post("/v1/systemone", content=b"not zstd", headers={"content-encoding": "zstd"}).status_code == 400


def test_loading_then_ready(engine):
    def slow_loader():
        time.sleep(0.5)
        return engine

    with TestClient(create_app(slow_loader)) as c:
        early = c.post("/v1/systemone", json=body({"r": NOUL}))
        assert early.status_code == 503 and early.headers["retry-after"]
        assert c.get("/health").status_code == 503
        for _ in range(50):
            if c.get("/health").status_code == 200:
                break
            time.sleep(0.1)
        assert c.post("/v1/systemone", json=body({"r": NOUL})).status_code == 200


def test_failed_load_is_reported(engine):
    def broken():
        raise RuntimeError("no weights")

    with TestClient(create_app(broken)) as c:
        time.sleep(0.2)
        h = c.get("/health")
        assert h.status_code == 503 and "no weights" in h.json()["error"]
        r = c.post("/v1/systemone", json=body({"r": NOUL}))
        assert r.status_code == 503 and r.json()["detail"]["error_type"] == "model_unavailable"


def test_concurrent_requests_are_all_answered(client):
    from concurrent.futures import ThreadPoolExecutor

    payloads = [body({f"q{i}": NOUL, "t": CHOICE}) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: client.post("/v1/systemone", json=p), payloads))
    assert [r.status_code for r in results] == [200] * 16
    first = results[0].json()["answers"]["t"]  # batched or not, the same answer (to float rounding)
    for r in results:
        t = r.json()["answers"]["t"]
        assert t["choice"] == first["choice"]
        assert all(abs(t["probabilities"][k] - p) <= 1e-4 for k, p in first["probabilities"].items())


# ---------------------------------------------------------------- what a text model cannot read; request ids

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")  # a PNG's signature and header


@pytest.fixture
def served(engine):
    from prefill.bench.http import in_thread

    with in_thread(create_app(engine)) as url:
        yield url


def test_the_official_sdk_sending_an_image_gets_a_400_that_says_why(served):
    """The SDK sends image assets as multipart parts (its own request builders), and a box question as any other:
    each is refused with a 400 saying a text model cannot read images, never answered about the placeholder text."""
    from typesafe_sdk import Box, Image, Noul, TypeSafeBadRequestError, TypeSafeClient

    image = Image(PNG)
    asks = [
        dict(state=image, questions={"q": Noul(instructions="Is it a cat?")}),  # placed as the state
        dict(state="A photo.", questions={"q": Noul(instructions="Is it a cat?")}, assets={"photo": image}),
        dict(state="A photo.", questions={"where": Box(instructions="The cat")}),
    ]
    with TypeSafeClient(api_key="unused", base_url=served, timeout=60) as client:
        for ask in asks:
            with pytest.raises(TypeSafeBadRequestError) as refused:
                client.system_one(model="jev-latest", **ask)
            assert "vision-language model" in str(refused.value) and "cannot see an image" in str(refused.value)
            assert refused.value.request_id.startswith("req_")  # the SDK reads it into its error


def test_image_assets_in_a_json_body_are_refused_not_ignored(client):
    data = body({"r": NOUL}, assets={"<image:1>": {"type": "image", "format": "png", "data_base64": "iVBORw0KGgo="}})
    r = client.post("/v1/systemone", json=data)
    assert r.status_code == 400 and "image assets need a vision-language model" in r.json()["detail"]["message"]
    assert client.post("/v1/systemone", json=body({"r": NOUL}, assets={})).status_code == 200  # none is fine


def test_a_box_question_is_refused_by_name(client):
    r = client.post("/v1/systemone", json=body({"r": NOUL, "where": {"type": "box", "instructions": "the cat"}}))
    assert r.status_code == 400 and "'where'" in r.json()["detail"]["message"]


def test_every_response_carries_a_request_id_and_the_log_names_it(client, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="prefill.serving"):
        responses = [
            client.post("/v1/systemone", json=body({"r": NOUL})),  # an answer
            client.post("/v1/systemone", json=body({"r": {"type": "noul", "criteria": {"x": 1}}})),  # 422
            client.post("/v1/systemone", json=body({"r": NOUL}, model="nope")),  # 404
            client.get("/health"),
            client.get("/nowhere"),
        ]
    ids = [r.headers["x-typesafe-request-id"] for r in responses]
    assert [r.status_code for r in responses] == [200, 422, 404, 200, 404]
    assert len(set(ids)) == len(ids) and all(i.startswith("req_") for i in ids)
    for rid, r in zip(ids, responses):
        assert any(rid in m and str(r.status_code) in m for m in caplog.messages), rid
