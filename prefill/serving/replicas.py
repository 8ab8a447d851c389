"""`prefill serve --replicas N [--max-replicas M]`: N engine replicas behind Ray Serve (autoscaled up to
M), with state affinity.

Each replica is a whole prefill server in a Ray actor (the same app as `prefill serve`: auth, validation,
its own bounded queue and batching, its own state cache), reached in-process through its ASGI app. In
front, one light ingress deployment takes every HTTP request, reads the state out of the body, and asks the
replicas' handle for it with that state's hash: `StateAffinityRouter` ranks the replicas by rendezvous
hashing on it, so requests about the same state go to the replica whose state cache has it, and spill to
the next one only when that one is at its `max_ongoing_requests`. The HTTP contract is the replicas', so it
is exactly `prefill serve`'s. A replica that dies mid-request is retried once on another (a request has no
side effects); if that fails too the client gets a 503 with Retry-After, never a hang, and Ray Serve
replaces the replica.

Headers `x-prefill-replica` (the replica's id) and `x-prefill-replica-pid` say who answered.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("prefill.serving")
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "host"}


class StateAffinityRouter(RequestRouter):
    """Replicas ranked by rendezvous hashing on the request's state: the same state, the same first choice
    (its cached keys/values are there), and an even spread of distinct states; with no state (an
    unparsable body, GET /v1/models), any, the least loaded."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        key = (pending_request.kwargs.get("affinity") if pending_request else None) or ""
        if not key:
            return [list(candidate_replicas)]  # one rank: Serve takes the one with the shortest queue

        def score(replica: RunningReplica) -> bytes:
            return hashlib.sha256(f"{key}|{replica.replica_id.unique_id}".encode()).digest()

        return [[r] for r in sorted(candidate_replicas, key=score)]


class Replica:
    """One prefill server: `build()` returns its ASGI app (the engines loaded, `create_app` around them)."""

    def __init__(self, build, threads: int):
        import httpx
        import torch

        torch.set_num_threads(threads)
        self.app = build()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://replica", timeout=None
        )
        self.id = serve.get_replica_context().replica_id.unique_id

    async def handle(
        self, method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes, affinity: str = ""
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        r = await self.client.request(method, path + (f"?{query}" if query else ""), headers=headers, content=body)
        out = [(k, v) for k, v in r.headers.items() if k.lower() not in HOP_HEADERS]
        return (
            r.status_code,
            out + [("x-prefill-replica", self.id), ("x-prefill-replica-pid", str(os.getpid()))],
            r.content,
        )


class Ingress:
    """Every HTTP request: find the state, send the request to the replicas' handle keyed by it, answer.
    `GET /health` is 503 until every replica is up (a load balancer then sends traffic when all can take
    it), then a replica's own /health with `replicas` added."""

    def __init__(self, replicas, count: int):
        self.replicas, self.count = replicas, count

    async def __call__(self, request: Request) -> Response:
        from .middleware import REQUEST_ID_HEADER, new_request_id

        if request.url.path == "/health":
            running = _running_replicas()
            if running < self.count:
                headers = {"Retry-After": "2", REQUEST_ID_HEADER: new_request_id()}
                return JSONResponse({"status": "loading", "replicas": running, "of": self.count}, 503, headers=headers)
        body = await request.body()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        call = (request.method, request.url.path, request.url.query, headers, body)
        key = affinity(body, request.headers.get("content-encoding", ""))
        for attempt in (1, 2):
            try:
                status, out, content = await self.replicas.handle.remote(*call, affinity=key)
                return Response(content, status, headers=dict(out))
            except Exception as e:  # noqa: BLE001 — a replica that died: once more, elsewhere
                log.warning("replica failed (attempt %d): %s: %s", attempt, type(e).__name__, e)
        rid = new_request_id()  # the replicas' own responses carry theirs; this one is the ingress's
        log.warning("%s %s %s 503: the replica failed twice", rid, request.method, request.url.path)
        return JSONResponse(
            {
                "detail": {
                    "error_type": "overloaded_error",
                    "message": "the replica answering this request failed twice; retry",
                }
            },
            503,
            headers={"Retry-After": "2", REQUEST_ID_HEADER: rid},
        )


def _running_replicas() -> int:
    from ray.serve._private.common import ReplicaState

    app = serve.status().applications.get("prefill")
    deployment = app.deployments.get("prefill-replica") if app else None
    return deployment.replica_states.get(ReplicaState.RUNNING, 0) if deployment else 0


def affinity(body: bytes, encoding: str) -> str:
    """The hash of the request's state, or "" when the body is not a readable request."""
    from .middleware import _decompress

    try:
        state = json.loads(_decompress(encoding.strip().lower(), body, 64 * 1024 * 1024))["state"]
    except Exception:  # noqa: BLE001 — routed anywhere; the replica gives the 4xx
        return ""
    return hashlib.sha256(json.dumps(state, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def replica_options(
    replicas: int,
    max_replicas: int | None,
    cpus: float,
    max_ongoing_requests: int,
    target_ongoing_requests: int,
    gpus: float = 0,
) -> dict:
    """The replica deployment's Ray Serve options: `replicas` fixed, or with `max_replicas` autoscaled
    between the two on ongoing requests per replica (Ray Serve's autoscaler: above the target for a while,
    one more replica; below it, one fewer, never under `replicas`). Each replica gets the CPUs it would have
    at the most replicas, so scaling up never waits for CPUs that a running replica holds; on a cluster with
    GPUs, one GPU each (not tried here: no GPU)."""
    top = max(replicas, max_replicas or replicas)
    actor = {"num_cpus": cpus / top, **({"num_gpus": 1} if gpus else {})}
    options = {
        "max_ongoing_requests": max_ongoing_requests,
        "ray_actor_options": actor,
        "request_router_config": RequestRouterConfig(request_router_class=StateAffinityRouter),
    }
    if top == replicas:
        return {**options, "num_replicas": replicas}
    return {
        **options,
        "autoscaling_config": {
            "min_replicas": replicas,
            "initial_replicas": replicas,
            "max_replicas": top,
            "target_ongoing_requests": target_ongoing_requests,
        },
    }


class PortInUse(OSError):
    """The port to serve on is taken."""


@contextlib.contextmanager
def held(host: str, port: int):
    """Bind host:port for the duration, so that the processes Ray starts meanwhile (its metrics exporter,
    its agents: random ports, each tried by binding) cannot take it; Serve's proxy binds it right after.
    Seen in CI: Ray's metrics exporter took the port the serve was given, and answered its /health.
    A port that is already taken raises `PortInUse` before anything starts."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise PortInUse(f"cannot serve on {host}:{port}: {e.strerror}") from e
    try:
        yield
    finally:
        sock.close()


def run(
    build,
    *,
    replicas: int,
    host: str,
    port: int,
    address: str | None = None,
    max_replicas: int | None = None,
    max_ongoing_requests: int = 16,
    target_ongoing_requests: int = 8,
) -> None:
    """Start (or join, at `address`) a Ray cluster, deploy the ingress and `replicas` replicas of
    `build()` (autoscaled up to `max_replicas`), and serve on host:port until interrupted."""
    import ray

    # Serve skips a replica that does not say how busy it is within 0.1 s (its default) and routes to the
    # next one: on a loaded 2-core machine that broke the state affinity for most requests; 1 s keeps it.
    os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")
    if not ray.is_initialized():
        # a local Ray's own servers pick random ports: not this one
        with held(host, port) if address is None else contextlib.nullcontext():
            ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    resources = ray.cluster_resources()
    options = replica_options(
        replicas,
        max_replicas,
        resources.get("CPU", 1),
        max_ongoing_requests,
        target_ongoing_requests,
        resources.get("GPU", 0),
    )
    serve.start(http_options={"host": host, "port": port})
    replica = serve.deployment(Replica, name="prefill-replica").options(**options)
    ingress = serve.deployment(Ingress, name="prefill-ingress").options(ray_actor_options={"num_cpus": 0})
    threads = max(1, int(options["ray_actor_options"]["num_cpus"]))
    serve.run(ingress.bind(replica.bind(build, threads), replicas), name="prefill", route_prefix="/", blocking=True)
