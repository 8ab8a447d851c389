"""Serving: the TypeSafe System One API over HTTP (FastAPI).

`POST /v1/systemone`, `GET /v1/models`, `GET /health`, `GET /metrics`. The model loads in the background
so the port answers at once: until it is ready, /health and requests get 503 with Retry-After (the SDKs
retry). Requests reach the model through the scheduler (scheduler.py): a bounded queue (429 past it), a
deadline (503), a disconnected client's work dropped, and waiting requests batched. Errors keep
TypeSafe's shapes: validation 422 `{"detail": [{loc, msg, type}]}`, anything else
`{"detail": {error_type, message}}`; a bad request is never a 5xx.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..backends import allocator
from ..backends.base import ReadoutUnsupported
from ..engine import Engine, EngineRequest, RequestTooLarge
from ..schema import ModelInfo, ModelList, SystemOneRequest, SystemOneResponse
from .errors import ERROR_HANDLERS, ApiError
from .middleware import DecodeBody, RequestIds
from .scheduler import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_WAIT_S,
    DeadlineExceeded,
    Job,
    Overloaded,
    Scheduler,
    wait_time,
)
from .telemetry import PROMETHEUS_TEXT, CountRequests, Telemetry

log = logging.getLogger("prefill.serving")
ALIASES = ("jev-latest", "jev-preview")
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class Served:
    """What one process serves: engines by model name (the base model and each trained readout, all on
    one backend when they share a base), and the one the `jev-*` aliases point to."""

    engines: dict[str, Engine]
    default: str

    @classmethod
    def of(cls, engines: Engine | Mapping[str, Engine] | Served, default: str | None = None) -> Served:
        if isinstance(engines, Served):
            return engines
        if not isinstance(engines, Mapping):  # one engine (the decoder's, or a static student's)
            engines = {engines.name: engines}
        engines = dict(engines)
        if not engines:
            raise ValueError("nothing to serve")
        default = default or next(iter(engines))
        if default not in engines:
            raise ValueError(f"--default-model {default!r} is not served; served: {sorted(engines)}")
        return cls(engines, default)

    def names(self) -> list[str]:
        return [*self.engines, *ALIASES]

    def engine(self, name: str) -> Engine:
        e = self.engines.get(self.default if name in ALIASES else name)
        if e is None:
            raise ApiError(404, "not_found_error", f"model {name!r} is not served here; use one of {self.names()}")
        return e


class _Slot:
    """The engines, once loaded, or why they are not there."""

    def __init__(self):
        self.engine: Served | None = None
        self.failure: str | None = None

    def get(self) -> Served:
        if self.engine is not None:
            return self.engine
        if self.failure is not None:
            raise ApiError(503, "model_unavailable", f"the model failed to load: {self.failure}")
        raise ApiError(503, "loading", "the model is still loading; retry shortly", {"Retry-After": "2"})


@dataclass
class _Context:
    """What the routes read from `request.app.state.prefill`."""

    slot: _Slot
    scheduler: Scheduler
    telemetry: Telemetry
    keys: list[bytes]


def create_app(
    engine: Engine | Mapping[str, Engine] | Served | Callable[[], Engine | Mapping[str, Engine] | Served],
    *,
    api_keys: Sequence[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    max_batch: int = DEFAULT_MAX_BATCH,
    batching: bool = True,
) -> FastAPI:
    """An app serving `engine` (or several, by model name: `Served`), or what a loader returns (run in a
    background thread). `max_queue`, `max_wait_s`, `max_batch`, `batching`: the scheduler's admission
    control and cross-request batching (scheduler.py)."""
    slot = _Slot()
    app = FastAPI(title="prefill", description="TypeSafe System One API, answered in one prefill pass.")
    telemetry = Telemetry(
        lambda: scheduler.depth, lambda: [e.backend for e in slot.engine.engines.values()] if slot.engine else []
    )
    scheduler = Scheduler(
        max_queue=max_queue,
        max_wait_s=max_wait_s,
        max_batch=max_batch,
        batching=batching,
        on_batch=lambda n, _seconds: telemetry.batch.observe(n),
        on_idle=allocator.hand_back,  # a burst's memory back to the system once it is over
    )
    app.state.scheduler = scheduler
    app.state.prefill = _Context(slot, scheduler, telemetry, [k.encode() for k in api_keys if k])
    _lifecycle(app, slot, scheduler, engine)
    app.include_router(router)
    for error, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(error, handler)
    app.add_middleware(DecodeBody, max_bytes=max_body_bytes)
    app.add_middleware(CountRequests, telemetry=telemetry)
    app.add_middleware(RequestIds)  # outermost: every response, errors from the layers below included
    return app


def _lifecycle(app: FastAPI, slot: _Slot, scheduler: Scheduler, engine) -> None:
    """The engines, given or loaded in a background thread at start-up; on shutdown the scheduler stops and
    the backends close."""
    app.router.on_shutdown.append(scheduler.close)

    def close_backends() -> None:
        """Backends that hold processes (vLLM's engine core) stop with the server: uvicorn ends a SIGTERM'd
        process by re-raising the signal, so atexit never runs and the children would be orphaned."""
        for backend in {id(e.backend): e.backend for e in slot.engine.engines.values()}.values() if slot.engine else ():
            backend.close()

    app.router.on_shutdown.append(close_backends)
    if not callable(engine):
        slot.engine = Served.of(engine)
        return

    def load() -> None:
        try:
            slot.engine = Served.of(engine())
        except Exception as e:  # noqa: BLE001 — reported on /health and to every request
            log.exception("model load failed")
            slot.failure = f"{type(e).__name__}: {e}"

    app.router.on_startup.append(lambda: threading.Thread(target=load, name="prefill-load", daemon=True).start())


# ---------------------------------------------------------------- routes


def authenticate(request: Request) -> None:
    keys = request.app.state.prefill.keys
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(
            401,
            "authentication_error",
            "an API key is required: send Authorization: Bearer <key>",
            {"WWW-Authenticate": "Bearer"},
        )
    given_b = given.strip().encode()
    ok = False
    for k in keys:  # constant time per key, and every key is compared
        ok |= hmac.compare_digest(given_b, k)
    if not ok:
        raise ApiError(401, "authentication_error", "the API key is not valid", {"WWW-Authenticate": "Bearer"})


router = APIRouter()


@router.get("/health")
def health(request: Request):
    slot = request.app.state.prefill.slot
    if slot.engine is not None:
        return {"status": "ok", "model": slot.engine.default, "models": list(slot.engine.engines)}
    status = "failed" if slot.failure else "loading"
    return JSONResponse({"status": status, "error": slot.failure}, 503, headers={"Retry-After": "2"})


@router.get("/v1/models", response_model=ModelList, dependencies=[Depends(authenticate)])
def models(request: Request):
    served = request.app.state.prefill.slot.get()
    return ModelList(
        models=[
            ModelInfo(
                name=n,
                release_date=served.engine(n).backend.release_date,
                description=served.engines[n].description if n in served.engines else f"alias of {served.default}",
            )
            for n in served.names()
        ]
    )


@router.get("/metrics", dependencies=[Depends(authenticate)])
def metrics(request: Request):
    return Response(request.app.state.prefill.telemetry.render(), media_type=PROMETHEUS_TEXT)


@router.post("/v1/systemone", response_model=SystemOneResponse, dependencies=[Depends(authenticate)])
async def systemone(req: SystemOneRequest, request: Request):
    ctx: _Context = request.app.state.prefill
    e = ctx.slot.get().engine(req.model)
    call = EngineRequest(req.state, req.questions, req.x_reference_date)
    try:
        job = ctx.scheduler.submit(e, call)
    except Overloaded as err:
        raise ApiError(429, "rate_limit_error", str(err), {"Retry-After": str(err.retry_after)}) from err
    try:
        found = await _outcome(job, request, ctx.scheduler)
    except (DeadlineExceeded, _ClientGone) as err:
        retry = getattr(err, "retry_after", 1)
        raise ApiError(503, "overloaded_error", str(err), {"Retry-After": str(retry)}) from err
    except RequestTooLarge as err:
        raise ApiError(413, "request_too_large", str(err)) from err
    except ReadoutUnsupported as err:
        raise ApiError(400, "invalid_request_error", str(err)) from err
    d = await run_in_threadpool(e.conclude, *call, found)
    ctx.telemetry.answered(d)
    response = SystemOneResponse(
        model=e.name,
        answers=d.answers,
        usage=d.usage,
        x_low_confidence=d.low_confidence,
        x_escalated=d.escalated,
        x_truncated=d.truncated,
    )
    return JSONResponse(response.model_dump(mode="json"))


async def _outcome(job: Job, request: Request, scheduler: Scheduler):
    """The job's result, once the worker has run it; dropped unrun if its client disconnects or its
    deadline passes while it waits (a job already running is waited for: its answer is seconds away)."""
    result = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {result, gone}, timeout=wait_time(job, scheduler.max_wait_s), return_when=asyncio.FIRST_COMPLETED
        )
        if result not in done and scheduler.drop(job):
            if gone in done:
                raise _ClientGone("the client disconnected; its request was dropped unanswered")
            raise DeadlineExceeded(scheduler.max_wait_s, scheduler.retry_after())
        return await result
    finally:
        gone.cancel()


class _ClientGone(Exception):
    pass


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
