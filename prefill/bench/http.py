"""4. HTTP: prefill serve on loopback under concurrent clients."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..api import Prefill
from .measure import STATE, nouls

# ---------------------------------------------------------------- 4. HTTP


class LocalServer:
    """The System One app on a free loopback port, in a background thread."""

    def __init__(self, pf: Prefill):
        import uvicorn

        from ..serving.app import create_app

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(create_app(pf.engine), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalServer:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


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
