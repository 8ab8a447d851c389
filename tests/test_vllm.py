"""--backend vllm, live, against the torch tree engine on the default model (fp32): the same answers for a
request with every hard case, the same answers again when vLLM's prefix cache holds the request (the
stale-row trap), the conformance suite, and what --backend vllm refuses.

vLLM 0.32 needs older transformers and fastapi than the main venv, so its server runs from the second venv
that `make vllm-setup` builds (.venv-vllm); `make test` builds it and sets PREFILL_REQUIRE_VLLM, so in CI a
missing vLLM venv fails instead of skipping.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prefill.bench.http import model_tokens, served
from prefill.schema import wire_questions

from .helpers import VLLM_PYTHON, need_vllm

pytestmark = [pytest.mark.default_model, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
STATE = (
    "Hi, I was charged twice for order 5512 and the parcel arrived damaged. I want this fixed today or I "
    "will dispute it with my bank."
)
POLICY = (
    "Read our refund policy first. Refunds are paid within 14 days to the original payment method. "
    "Damaged goods are replaced or refunded at the customer's choice. Double charges are reversed at "
    "once. Disputes opened with a bank freeze the account until they are settled. Now the question: "
)


def big_request() -> dict:
    """21 yes/no, a 12-option choice whose options collide on their first tokens, a 5-level score and a
    255-option choice (every option starts with the same token)."""
    q: dict = {
        f"n{i}": {
            "type": "noul",
            "instructions": f"Does the message mention topic number {i}, or anything close to it?",
        }
        for i in range(21)
    }
    q["queue"] = {
        "type": "choice",
        "instructions": "Which queue should take this message?",
        "criteria": dict.fromkeys(
            [
                "fraud",
                "fraud review",
                "fraudulent chargeback",
                "refund",
                "refund request",
                "refund denied",
                "billing",
                "billing error",
                "bill dispute",
                "shipping",
                "shipping delay",
                "ship damage",
            ]
        ),
    }
    q["anger"] = {
        "type": "score",
        "instructions": "How angry is the customer?",
        "criteria": ["Calm", "Mild", "Annoyed", "Angry", "Furious"],
    }
    q["code"] = {
        "type": "choice",
        "instructions": "Which internal code fits this message best?",
        "criteria": {f"code {i}": None for i in range(1, 256)},
    }
    return q


def shared_prefix_request(n: int) -> dict:
    """Questions that share a long prefix (the policy), so their sequences share cached blocks."""
    asks = [
        "Is a refund owed?",
        "Is the account at risk of a freeze?",
        "Was the customer charged twice?",
        "Is a replacement an option?",
    ]
    return {f"p{i}": {"type": "noul", "instructions": POLICY + asks[i]} for i in range(n)}


@pytest.fixture(scope="module")
def vllm_url():
    need_vllm()
    with served(None, "--backend", "vllm", "--calibration", "none", python=str(VLLM_PYTHON)) as (url, pid):
        children = [
            int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        ]
        yield url
    # Stopped with SIGTERM, the server takes vLLM's engine core (a child process) with it: an orphaned core
    # and its worker were seen spinning on two cores after the server had gone.
    deadline = time.monotonic() + 60
    while (alive := [c for c in children if Path(f"/proc/{c}").exists()]) and time.monotonic() < deadline:
        time.sleep(1)
    assert children and not alive, f"vLLM processes outlived the server: {alive}"


def ask(url: str, state: str, questions: dict) -> dict:
    r = httpx.post(
        url + "/v1/systemone", json={"model": "jev-latest", "state": state, "questions": questions}, timeout=900
    )
    assert r.status_code == 200, r.text
    return r.json()["answers"]


def probabilities(answer: dict) -> dict[str, float]:
    return answer.get("probabilities") or {"yes": answer["noul"]}


def max_gap(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    return max(abs(probabilities(got[k])[o] - probabilities(want[k])[o]) for k in got for o in probabilities(got[k]))


def torch_answers(pf, state: str, questions: dict) -> dict:
    answers, _ = pf.engine.ask(state, wire_questions(questions))
    return {k: v.model_dump(mode="json") for k, v in answers.items()}


def test_vllm_answers_equal_the_tree_engine(vllm_url, default_prefill):
    questions = big_request()
    got = ask(vllm_url, STATE, questions)
    want = torch_answers(default_prefill, STATE, questions)
    assert max_gap(got, want) <= TOL
    assert len(got["code"]["probabilities"]) == 255


def test_cached_requests_read_fresh_rows(vllm_url, default_prefill):
    """The stale-row trap: the same request twice, then after another request on the same state with
    questions sharing its long prefix, then again. The repeats run fewer tokens (the prefix cache is read)
    and still give the torch engine's answers."""
    first_q = shared_prefix_request(2)
    other_q = shared_prefix_request(4)
    want = torch_answers(default_prefill, STATE, first_q)
    before = model_tokens(vllm_url)
    first = ask(vllm_url, STATE, first_q)
    cost_first = model_tokens(vllm_url) - before
    again = ask(vllm_url, STATE, first_q)
    cost_again = model_tokens(vllm_url) - before - cost_first
    other = ask(vllm_url, STATE, other_q)
    last = ask(vllm_url, STATE, first_q)
    assert cost_again < cost_first / 2, (cost_first, cost_again)
    metrics = httpx.get(vllm_url + "/metrics", timeout=10).text
    assert "prefill_model_stale_reruns_total 0.0" in metrics  # vLLM's hits never reached a row read
    for answers in (first, again, last):
        assert max_gap(answers, want) <= TOL
    assert max_gap(other, torch_answers(default_prefill, STATE, other_q)) <= TOL


def test_jevcompat_conformance_on_vllm(vllm_url, tmp_path: Path):
    report = tmp_path / "report.json"
    # --timeout: on a CPU without AVX-512 (AVX2 only) vLLM's CPU kernels are slow, and the 255-option request
    # took over jevcompat's default 120 s
    run = subprocess.run(
        [sys.executable, "-m", "jevcompat.cli", "test", vllm_url, "--json", str(report), "--timeout", "600"],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    results = json.loads(report.read_text())["results"]
    untested = ("auth.bearer", "auth.missing", "auth.invalid")  # no key set: test_default_model runs those
    assert not [r["id"] for r in results if r["status"] != "pass" and r["id"] not in untested], run.stdout[-4000:]


def test_the_trap_is_real_and_the_backend_avoids_it():
    """In the vLLM venv (tests/vllm_checks.py, SmolLM2): vLLM's own prompt_logprobs over its prefix cache
    return garbage for a repeated sequence (the trap this backend is built around), while the backend's
    scores are the same on a cold cache, a warm one and after an injected cache hit that reaches the row
    read (which it detects and re-runs under a fresh cache_salt)."""
    need_vllm()
    run = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_checks.py")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(next(line for line in reversed(run.stdout.splitlines()) if line.startswith("{")))
    assert out["trap_rows_wrong"] > 0  # the naive way reads rows vLLM never computed
    assert out["backend_max_gap"] < 1e-6  # cold = warm = after the injected hit
    assert out["stale_reruns"] == 1  # the injected hit was caught and re-run
    assert out["warm_tokens"] < out["cold_tokens"]  # and the warm run did read the prefix cache


def test_a_killed_host_takes_vllm_with_it():
    """SIGKILL leaves no time to stop vLLM's engine core: the backend's watcher process stops it (and the core's
    workers follow) once the host is gone."""
    need_vllm()
    host = subprocess.Popen(
        [
            str(VLLM_PYTHON),
            "-c",
            "from prefill.api import Prefill; import time; "
            "Prefill('smollm2-135m-instruct', backend='vllm'); print('up', flush=True); time.sleep(900)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        assert host.stdout.readline().strip() == "up"
        tree = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True).stdout.split()[2:]
        parents = dict(zip(map(int, tree[::2]), map(int, tree[1::2])))
        core = [pid for pid, ppid in parents.items() if ppid == host.pid]
        workers = [pid for pid, ppid in parents.items() if ppid in core]
        assert core and workers
    finally:
        host.kill()
        host.wait()
    deadline = time.monotonic() + 60
    while (alive := [p for p in core + workers if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
        time.sleep(1)
    assert not alive, f"vLLM processes outlived their killed host: {alive}"


@pytest.mark.parametrize(
    "argv, reason",
    [
        (["train", "x.jsonl", "--out", "o", "--backend", "vllm"], "needs the torch backend"),
        (["serve", "--backend", "vllm", "--readout", "heads"], "hidden states"),
        (["eval", "data.jsonl", "--generate", "--backend", "vllm"], "needs the torch backend"),
    ],
)
def test_what_vllm_cannot_do_is_refused_at_once(argv, reason, capsys):
    from prefill.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert reason in capsys.readouterr().err
