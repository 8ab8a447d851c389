"""prefill serve: the TypeSafe System One API over HTTP."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

from ..serving.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, DEFAULT_MAX_WAIT_S
from ..settings import Settings
from .common import build_prefill, has_adapter

HELP = "serve the TypeSafe System One API"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default %(default)s; make serve: 0.0.0.0)"
    )
    p.add_argument("--port", type=int, default=8000, help="the port to listen on (default %(default)s)")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require this Bearer key (repeatable; also PREFILL_API_KEYS, comma-separated)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn's log level (default %(default)s)")
    p.add_argument(
        "--default-model",
        default=None,
        help="the served model the jev-* aliases point to (default: the first --readout, else the base)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help="requests that may be in at once, waiting or running; past it, 429 with Retry-After "
        "(default: 4 per CPU core)",
    )
    p.add_argument(
        "--max-wait",
        type=float,
        default=DEFAULT_MAX_WAIT_S,
        help="seconds a request may wait in the queue before it is dropped with 503 + Retry-After "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help="waiting requests run together in shared passes, at most this many (default %(default)s)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="serve N engine replicas behind Ray Serve, requests about one state to one replica "
        '(pip install "prefill[ray]"; default: one process, no Ray)',
    )
    p.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        help="with --replicas N: autoscale between N and this many replicas on ongoing requests "
        "per replica (target: --max-batch)",
    )
    p.add_argument(
        "--ray-address", default=None, help="with --replicas: the Ray cluster to join (default: a local one)"
    )
    p.add_argument(
        "--batching",
        default="on",
        choices=["on", "off"],
        help="cross-request batching (default on; docs/measurements/serving-under-load.md has the measurement)",
    )


def run(settings: Settings, args) -> int:
    import uvicorn

    from ..build import plan as make_plan
    from ..loading import ModelNotFound, default_note

    try:
        # a wrong path or a missing default model fails now, not in the background; what will run is
        # decided here, once (the route may take auto's int8 back to fp32), so the first line says it
        plan = make_plan(settings)
        check(settings, args, plan.name)
    except (ModelNotFound, ValueError) as e:
        print(f"prefill serve: {e}", file=sys.stderr)
        return 2
    if note := default_note(settings.model, plan.precision):
        print(f"prefill serve: {note}", file=sys.stderr)
    keys = list(args.api_key) + [k.strip() for k in os.environ.get("PREFILL_API_KEYS", "").split(",") if k.strip()]
    if args.replicas:  # each replica plans for the machine it runs on
        return serve_on_ray(settings, args, keys)
    where, chosen = f"http://{args.host}:{args.port}", ", as --dtype auto chose for this CPU" if plan.auto else ""
    print(
        f"prefill serve: loading {plan.name} ({plan.precision}{chosen}) in the background; "
        f"{where}/health says when it is ready",
        file=sys.stderr,
    )
    uvicorn.run(app(settings, args, keys, plan=plan), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def serve_on_ray(settings: Settings, args, keys: list[str]) -> int:
    """--replicas: the same app in each replica behind Ray Serve (serving/replicas.py)."""
    try:
        from ..serving import replicas
    except ImportError:
        print('prefill serve: --replicas needs Ray Serve: pip install "prefill[ray]"', file=sys.stderr)
        return 2
    build = functools.partial(app, settings, args, keys, loaded=True)
    bounds = dict(replicas=args.replicas, max_replicas=args.max_replicas, target_ongoing_requests=args.max_batch)
    try:
        replicas.run(build, host=args.host, port=args.port, address=args.ray_address, **bounds)
    except replicas.PortInUse as e:
        print(f"prefill serve: {e}", file=sys.stderr)
        return 2
    return 0


def app(settings: Settings, args, keys: list[str], loaded: bool = False, plan=None):
    """The app: the engines load in the background (or here, `loaded`: a Ray Serve replica, which is ready
    when its constructor returns). `plan`: what `run` decided and announced."""
    from ..serving.app import create_app

    load = functools.partial(engines, settings, args.default_model, plan)
    return create_app(
        load() if loaded else load,
        api_keys=keys,
        max_queue=args.max_queue,
        max_wait_s=args.max_wait,
        max_batch=args.max_batch,
        batching=args.batching == "on",
    )


def engines(settings: Settings, default_model: str | None, plan=None):
    """What is served: the plain base model under its own name and every --readout beside it, all on one
    copy of the weights and one state cache; the jev-* aliases point to `default_model` (default: the first
    readout). A readout trained with a LoRA changes the weights: it is served alone."""
    from ..serving.app import Served

    started = time.perf_counter()
    pf = build_prefill(settings, "serve", plan)
    if pf.engine.heads is None:  # (a LoRA readout among others was refused by `check`)
        for name, path in settings.readouts:
            pf.add_readout(path, name)
    default = default_model or (list(pf.engines)[1] if len(pf.engines) > 1 else pf.engine.name)
    names = ", ".join(pf.engines)
    warming = pf.warm_up()  # the first user request would otherwise pay the process's one-time costs
    print(
        f"prefill serve: ready in {time.perf_counter() - started:.0f} s (warm-up request {warming:.1f} s): "
        f"{pf.backend.description}; serving {names}",
        file=sys.stderr,
        flush=True,
    )
    return Served.of(pf.engines, default)


def check(settings: Settings, args, base: str) -> None:
    """What can be told before loading the model, told at start-up (exit 2) rather than as a 503 later."""
    from ..build import check_shared
    from ..calibration import check_calibration
    from ..fallback import check_remote
    from ..heads import Heads

    if args.max_replicas is not None and not 0 < args.replicas <= args.max_replicas:
        raise ValueError("--max-replicas M needs --replicas N with 0 < N <= M (N: the fewest replicas)")
    check_calibration(settings.calibration)
    for _, path in settings.readouts:
        if not Path(path).exists():
            raise ValueError(f"--readout {path}: no such file or folder")
    check_shared([has_adapter(path) for _, path in settings.readouts])
    names = [base] + [name or f"{base}+{Heads.load(path).name}" for name, path in settings.readouts]
    if len(set(names)) < len(names):
        raise ValueError(f"two served models would have the same name ({names}); name them: --readout NAME=DIR")
    if args.default_model and args.default_model not in names:
        raise ValueError(f"--default-model {args.default_model!r} is not served; served: {names}")
    if settings.fallback_url:
        check_remote(settings.fallback_kind, settings.fallback_model)
