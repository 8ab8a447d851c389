"""Serving under load (serving/scheduler.py, serving/telemetry.py): the bounded queue and its 429, the
deadline's 503, a disconnected client's work dropped, waiting requests batched (each answer as alone), and
/metrics moving as requests are served. The model is held at a gate so that the queue's state is known."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import threading
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from prefill.bench.http import in_thread
from prefill.engine import Engine
from prefill.serving.app import create_app

from .helpers import CHOICE, NOUL, SCORE, body, make_backend, make_model


class Gated:
    """A backend whose passes wait at a gate, counting the model batches it runs and their sizes."""

    def __init__(self, inner):
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def score_many(self, jobs):
        self.batches.append(len(jobs))
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.inner.score_many(jobs)

    def score(self, state, questions):  # the content-free priors: not gated
        return self.inner.score(state, questions)


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    return make_model("llama", len(tokenizer))


@pytest.fixture
def gated(tiny_model, tokenizer):
    return Gated(make_backend(tiny_model, tokenizer))


def waiting(app, n: int, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while app.state.scheduler.depth != n:
        assert time.monotonic() < deadline, f"expected {n} queued, found {app.state.scheduler.depth}"
        time.sleep(0.01)


def asked(state: str) -> dict:
    return {**body({"r": NOUL, "t": CHOICE, "a": SCORE}), "state": state}


def test_full_queue_is_429_at_once_and_waiting_requests_run_together(gated, tiny_model, tokenizer):
    app = create_app(Engine(gated), max_queue=3, max_batch=8)  # one running and two waiting: full
    with TestClient(app, raise_server_exceptions=False) as c, cf.ThreadPoolExecutor(4) as pool:
        first = pool.submit(c.post, "/v1/systemone", json=asked("A first message."))
        assert gated.entered.wait(10)  # running, held at the gate
        queued = [pool.submit(c.post, "/v1/systemone", json=asked(s)) for s in ("Second.", "A third, longer one.")]
        waiting(app, 2)
        start = time.monotonic()
        refused = c.post("/v1/systemone", json=asked("Fourth."))
        assert time.monotonic() - start < 1.0  # refused at once, not after a wait
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["detail"]["error_type"] == "rate_limit_error"
        gated.gate.set()
        answers = [f.result(30) for f in (first, *queued)]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert gated.batches == [1, 2]  # the two that waited ran in one batch
    alone = Engine(make_backend(tiny_model, tokenizer))
    for r, state in zip(answers[1:], ("Second.", "A third, longer one.")):
        expected = alone.decide(state, {k: q for k, q in _questions().items()})
        for qid, a in r.json()["answers"].items():
            want = expected.answers[qid].model_dump(mode="json")
            got = [a["noul"]] if a["type"] == "noul" else list(a["probabilities"].values())
            ref = [want["noul"]] if a["type"] == "noul" else list(want["probabilities"].values())
            assert max(abs(x - y) for x, y in zip(got, ref)) <= 1e-4


def _questions():
    from prefill.schema import SystemOneRequest

    return SystemOneRequest.model_validate(asked("x")).questions


def test_a_request_past_its_deadline_is_503_and_never_computed(gated):
    app = create_app(Engine(gated), max_wait_s=0.5, max_batch=1)
    with TestClient(app, raise_server_exceptions=False) as c, cf.ThreadPoolExecutor(2) as pool:
        first = pool.submit(c.post, "/v1/systemone", json=asked("Held at the gate."))
        assert gated.entered.wait(10)
        late = c.post("/v1/systemone", json=asked("Waits too long."))
        assert late.status_code == 503 and int(late.headers["Retry-After"]) >= 1
        assert late.json()["detail"]["error_type"] == "overloaded_error"
        gated.gate.set()
        assert first.result(30).status_code == 200
    assert gated.batches == [1]  # the late one never reached the model


def _post_and_hang_up(url: str, payload: dict) -> None:
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps(payload).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
        )
        time.sleep(0.2)  # queued by now; then the client goes away


def test_a_disconnected_clients_work_is_dropped(gated):
    app = create_app(Engine(gated), max_batch=1)
    with in_thread(app) as url, cf.ThreadPoolExecutor(2) as pool:
        import httpx

        first = pool.submit(httpx.post, url + "/v1/systemone", json=asked("Held at the gate."), timeout=30)
        assert gated.entered.wait(10)
        for i in range(4):
            _post_and_hang_up(url, asked(f"Nobody waits for this one ({i})."))
        deadline = time.monotonic() + 10
        while app.state.scheduler.depth and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.scheduler.depth == 0  # the four were taken back out of the queue
        gated.gate.set()
        assert first.result(30).status_code == 200
        time.sleep(0.3)
    assert gated.batches == [1]  # 5 requests sent, 1 forward batch run


def metrics(c) -> dict[tuple, float]:
    r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


def test_metrics_move_as_requests_are_served(tiny_model, tokenizer):
    engine = Engine(make_backend(tiny_model, tokenizer))
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:
        before = metrics(c)
        ok = {
            **asked("I was charged twice: the total is 40 EUR."),
            "questions": {"r": NOUL, "t": CHOICE, "n": {"type": "noul", "instructions": "Is the total over 30 EUR?"}},
        }
        assert c.post("/v1/systemone", json=ok).status_code == 200
        assert c.post("/v1/systemone", json=ok).status_code == 200  # same state: a cache hit
        assert c.post("/v1/systemone", json={"model": "jev-latest"}).status_code == 422
        after = metrics(c)

    def moved(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert moved("prefill_requests_total", endpoint="/v1/systemone", status="200") == 2
    assert moved("prefill_requests_total", endpoint="/v1/systemone", status="422") == 1
    assert moved("prefill_request_seconds_count", endpoint="/v1/systemone") == 3
    assert moved("prefill_questions_total", path="model") == 4
    assert moved("prefill_questions_total", path="fact") == 2
    assert moved("prefill_state_cache_misses_total") >= 1 and moved("prefill_state_cache_hits_total") >= 1
    assert moved("prefill_model_tokens_total") > 0 and moved("prefill_input_tokens_total") > 0
    assert moved("prefill_batch_requests_count") == 2
    assert after[("prefill_queue_depth", ())] == 0


def test_metrics_need_the_key_when_keys_are_set(tiny_model, tokenizer):
    with TestClient(create_app(Engine(make_backend(tiny_model, tokenizer)), api_keys=["k1"])) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer k1"}).status_code == 200


def test_memory_is_handed_back_once_after_a_burst_never_between_its_requests(monkeypatch):
    """on_idle (the allocator's hand-back in the server) runs once the queue has stayed empty IDLE_S after work:
    never while requests follow each other closely, never twice for one burst, never before any work."""
    from prefill.engine import EngineRequest
    from prefill.serving import scheduler as scheduling

    monkeypatch.setattr(scheduling, "IDLE_S", 0.3)
    calls: list[float] = []

    class Engine:
        def score_requests(self, requests):
            time.sleep(0.02)
            return [object() for _ in requests]

    s = scheduling.Scheduler(on_idle=lambda: calls.append(time.monotonic()))
    engine = Engine()
    time.sleep(0.5)
    assert calls == []  # no work yet
    ended = None
    for _ in range(10):  # a burst: each request submitted as the last one is answered
        s.submit(engine, EngineRequest("state", {}, None)).future.result(5)
        ended = time.monotonic()
    time.sleep(1.0)
    assert len(calls) == 1 and calls[0] - ended >= 0.3  # once, after the queue stayed empty
    s.submit(engine, EngineRequest("state", {}, None)).future.result(5)
    time.sleep(0.6)
    assert len(calls) == 2  # the next burst is handed back too
    s.close()


def test_the_allocator_hands_freed_memory_back():
    """glibc keeps up to KEEP_FREED bytes freed in its heap (allocator.tune); hand_back returns them."""
    from prefill.backends import allocator

    def rss_mib() -> float:
        status = open("/proc/self/status").read()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024

    if not allocator.tune():
        pytest.skip("not glibc")
    blocks = [bytearray(4 << 20) for _ in range(40)]  # 160 MB from the heap (under the 32 MB mmap threshold)
    del blocks
    kept = rss_mib()
    assert allocator.hand_back()
    assert rss_mib() < kept - 100
