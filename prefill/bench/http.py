"""4. HTTP: prefill serve on loopback, in this process (`in_thread`) or as a command (`served`, `started`), under
concurrent clients. These are also the lab's and the tests' way to run and read a real server (the benchmarks'
load test, the tests of serving): the bench's internal API, kept as documented here."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .measure import STATE, nouls

# ---------------------------------------------------------------- 4. HTTP


@contextlib.contextmanager
def in_thread(app) -> Iterator[str]:
    """`app` (create_app's) served by uvicorn on a free loopback port in a background thread: its URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def http_load(url: str, clients: int, requests: int, n_questions: int, max_seconds: float) -> dict:
    """`requests` requests (distinct states, so none hits the state cache) from `clients` concurrent
    clients, stopping early after `max_seconds`."""
    import httpx

    questions = {k: q.model_dump(exclude_none=True) for k, q in nouls(n_questions).items()}
    deadline = time.monotonic() + max_seconds
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal failures
        if time.monotonic() > deadline:
            return
        with httpx.Client(base_url=url, timeout=600) as client:
            t = time.perf_counter()
            r = client.post(
                "/v1/systemone", json={"model": "jev-latest", "state": f"[{i}] {STATE}", "questions": questions}
            )
            with lock:
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - t)
                else:
                    failures += 1

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies.sort()
    q = lambda f: round(latencies[min(len(latencies) - 1, int(f * len(latencies)))], 3)  # noqa: E731
    return {
        "clients": clients,
        "questions_per_request": n_questions,
        "completed": len(latencies),
        "failed": failures,
        "p50_s": q(0.5),
        "p99_s": q(0.99),
        "requests_per_s": round(len(latencies) / wall, 3),
        "questions_per_s": round(len(latencies) * n_questions / wall, 2),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def started(cmd: list[str], url: str, ready: str = "/health", env: dict | None = None, within: float = 600):
    """A server process, once GET url+`ready` answers 200: its process. Its output goes to a file, shown in
    the error if it does not come up within `within` seconds; it is stopped (SIGTERM) on the way out."""
    import httpx

    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + within
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + ready, timeout=2).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"{cmd[0]} did not come up at {url}:\n{log.read()[-3000:]}")
                time.sleep(0.3)
            yield proc
        finally:
            proc.terminate()
            proc.wait(60)


@contextlib.contextmanager
def served(
    model: str | None, *extra: str, within: float = 600, python: str = sys.executable
) -> Iterator[tuple[str, int]]:
    """`prefill serve` on a free loopback port, once /health says ok: (url, pid). `python`: the venv's
    interpreter to run it with (.venv-vllm's for --backend vllm)."""
    port = free_port()
    cmd = [python, "-m", "prefill.cli", "serve", "--port", str(port), "--log-level", "warning", *extra]
    url = f"http://127.0.0.1:{port}"
    with started(cmd + (["--model", model] if model else []), url, within=within) as proc:
        yield url, proc.pid


def model_tokens(url: str, key: str | None = None) -> float:
    """The server's `prefill_model_tokens_total`: tokens its model has run (cached ones not counted)."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    return float(re.search(r"^prefill_model_tokens_total (\S+)$", text, re.M).group(1))


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory from /proc (`field`: VmRSS now, VmHWM its peak), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")
