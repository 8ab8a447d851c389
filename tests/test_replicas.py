"""`prefill serve --replicas 2`: two engine replicas behind Ray Serve on a local Ray started by the command,
with the torch backend and with the vLLM backend.
Answers equal one process's; requests about one state go to one replica, distinct states spread over both;
the HTTP contract (auth) is prefill's; a replica killed under load loses no request (each is answered, or
refused with 503 + Retry-After, never left hanging) and the service goes on."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from prefill.api import Prefill
from prefill.bench.http import free_port, started

from .helpers import VLLM_PYTHON, make_model, need_vllm

pytestmark = pytest.mark.slow  # a real command or a local Ray in a subprocess: the full tier

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"Billing": "invoices", "Technical": None, "Shipping": "parcels"},
    },
}
KEY = {"Authorization": "Bearer k1"}


def ask(url: str, state: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/systemone",
        json={"model": "jev-latest", "state": state, "questions": QUESTIONS},
        headers=KEY,
        timeout=60,
    )


def ask_as_a_client(url: str, state: str, attempts: int = 5) -> httpx.Response:
    """`ask`, retried as the SDKs retry: a 429 or 503 that carries Retry-After is the server's backpressure
    (a full queue, a request past its deadline on a loaded machine: the replicas' first requests under the
    whole test suite), answered by waiting and asking again; anything else is returned as it is."""
    for _ in range(attempts - 1):
        r = ask(url, state)
        if r.status_code not in (429, 503) or "retry-after" not in r.headers:
            return r
        time.sleep(float(r.headers["retry-after"]))
    return ask(url, state)


@pytest.fixture(scope="module", params=["torch", "vllm"])
def replicated(request, tmp_path_factory, tokenizer):
    """(url, the served model's directory, how close its answers are to one torch process's). The vLLM
    replicas run from the vLLM venv, on a tiny model with 32-wide heads (vLLM's CPU kernels take no 16)."""
    if request.param == "torch":
        directory, python, tol = request.getfixturevalue("model_dir"), sys.executable, 1e-6
    else:
        need_vllm()
        directory, python, tol = tmp_path_factory.mktemp("tiny-vllm"), str(VLLM_PYTHON), 1e-4
        make_model("llama", len(tokenizer), num_attention_heads=2, num_key_value_heads=1).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    port = free_port()
    cmd = [
        python,
        "-m",
        "prefill.cli",
        "serve",
        "--model",
        str(directory),
        "--replicas",
        "2",
        "--backend",
        request.param,
        "--port",
        str(port),
        "--api-key",
        "k1",
    ]
    url = f"http://127.0.0.1:{port}"
    with started(cmd, url, within=300):
        yield url, directory, tol


def test_replicas_answer_as_one_process_with_state_affinity(replicated):
    replicated, directory, tol = replicated
    one = Prefill(str(directory)).engine
    states = [f"Ticket {i}: I was charged twice and want my money back." for i in range(16)]
    with cf.ThreadPoolExecutor(8) as pool:  # concurrent clients
        burst = list(pool.map(lambda s: ask_as_a_client(replicated, s), states))
    assert all(r.status_code == 200 for r in burst), [
        (r.status_code, r.text[:300]) for r in burst if r.status_code != 200
    ]
    assert len({r.headers["x-prefill-replica"] for r in burst}) == 2  # spread over both
    first = [ask(replicated, s) for s in states]
    again = [ask(replicated, s) for s in states]
    for state, r, r2 in zip(states, first, again):
        assert r.status_code == 200 and r2.status_code == 200
        assert r.headers["x-prefill-replica"] == r2.headers["x-prefill-replica"]  # the state's replica
        alone = {k: a.model_dump(mode="json") for k, a in one.ask(state, _questions())[0].items()}
        got = r2.json()["answers"]
        assert abs(got["refund"]["noul"] - alone["refund"]["noul"]) <= tol
        assert got["team"]["choice"] == alone["team"]["choice"]
        for name, p in alone["team"]["probabilities"].items():
            assert abs(got["team"]["probabilities"][name] - p) <= tol
    assert len({r.headers["x-prefill-replica"] for r in first}) == 2  # distinct states spread
    assert httpx.post(replicated + "/v1/systemone", json={}, timeout=30).status_code == 401  # prefill's auth


def _questions():
    from prefill.schema import wire_questions

    return wire_questions(QUESTIONS)


def test_a_replica_killed_under_load_loses_no_request(replicated):
    replicated, _, _ = replicated
    victim = int(
        ask(replicated, "Ticket 0: I was charged twice and want my money back.").headers["x-prefill-replica-pid"]
    )
    stop = time.monotonic() + 8
    outcomes: list[tuple[int, str]] = []

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            try:
                r = ask(replicated, f"Load {i}-{n}: where is my parcel?")
                outcomes.append((r.status_code, r.headers.get("retry-after", "")))
            except httpx.HTTPError as e:
                outcomes.append((-1, type(e).__name__))
            n += 1

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client, i) for i in range(8)]
        time.sleep(2)
        os.kill(victim, signal.SIGKILL)
        for f in futures:
            f.result(timeout=120)  # nobody hangs
    assert outcomes and all(s == 200 or (s == 503 and retry) for s, retry in outcomes), sorted({s for s, _ in outcomes})
    assert ask(replicated, "After the kill: my parcel is late.").status_code == 200


def test_a_taken_port_is_refused_and_held_while_ray_starts(model_dir):  # noqa: F811
    from prefill.serving.replicas import PortInUse, held

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        cmd = [sys.executable, "-m", "prefill.cli", "serve", "--model", str(model_dir), "--replicas", "2"]
        done = subprocess.run([*cmd, "--port", str(port)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and f"cannot serve on 127.0.0.1:{port}" in done.stderr, done.stderr
        with pytest.raises(PortInUse):
            with held("127.0.0.1", port):
                pass
    with held("127.0.0.1", port), socket.socket() as ray_picks, pytest.raises(OSError):
        ray_picks.bind(("", port))  # what Ray's port picker tries, refused while held
    with socket.socket() as later:
        later.bind(("127.0.0.1", port))  # released after


def test_replica_bounds_become_fixed_or_autoscaled_deployments():
    from prefill.serving.replicas import replica_options

    fixed = replica_options(2, None, cpus=4, max_ongoing_requests=16, target_ongoing_requests=8)
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 2}
    scaled = replica_options(1, 4, cpus=4, max_ongoing_requests=16, target_ongoing_requests=8)
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {
        "min_replicas": 1,
        "initial_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 8,
    }
    assert scaled["ray_actor_options"] == {"num_cpus": 1}  # room for all four
    assert "StateAffinityRouter" in str(scaled["request_router_config"].request_router_class)


@pytest.mark.parametrize("flags", [["--max-replicas", "2"], ["--replicas", "3", "--max-replicas", "2"]])
def test_bad_replica_bounds_are_refused_at_start(flags, model_dir, capsys):  # noqa: F811
    from prefill.cli import main

    assert main(["serve", "--model", str(model_dir), *flags]) == 2
    assert "--max-replicas" in capsys.readouterr().err


def test_replicas_take_one_gpu_each_where_the_cluster_has_gpus():
    from prefill.serving.replicas import replica_options

    assert replica_options(2, None, cpus=8, max_ongoing_requests=16, target_ongoing_requests=8, gpus=2)[
        "ray_actor_options"
    ] == {"num_cpus": 4, "num_gpus": 1}
