"""`GET /metrics`: what the server is doing, in Prometheus' text format (prometheus-client).

Requests by endpoint and status and their latency are counted by an ASGI wrapper around the whole app, so
refusals (401, 413, 422, 429, 503) count as much as answers. The queue depth is read when scraped; the
model's own counters (forward passes, tokens run, state-cache hits and misses) are read from each served
backend when scraped, so they cannot drift from what the backend did. Each app has its own registry, so
several apps in one process (tests, a fallback server) do not mix their numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine import Decision

PROMETHEUS_TEXT = CONTENT_TYPE_LATEST
ENDPOINTS = ("/v1/systemone", "/v1/models", "/health", "/metrics")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BACKEND_COUNTERS = (  # (attribute, metric name, help)
    ("forward_calls", "prefill_model_forward_passes", "forward passes the model ran"),
    ("tokens_run", "prefill_model_tokens", "tokens the model's passes ran (shared prefixes and cached states once)"),
    ("state_hits", "prefill_state_cache_hits", "requests whose state was found in the state cache"),
    ("state_misses", "prefill_state_cache_misses", "requests whose state had to be run"),
    (
        "stale_reruns",
        "prefill_model_stale_reruns",
        "vLLM outputs run again because a cache hit reached the row read (expected 0)",
    ),
    (
        "truncated_questions",
        "prefill_truncated_questions",
        "questions read with their state cut to the encoder's positions",
    ),
)


class Telemetry:
    def __init__(self, queue_depth: Callable[[], int], backends: Callable[[], Iterable]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "prefill_requests", "HTTP requests answered, by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "prefill_request_seconds",
            "time from a request's arrival to its response",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        Gauge("prefill_queue_depth", "requests waiting for the model", registry=r).set_function(queue_depth)
        self.batch = Histogram(
            "prefill_batch_requests",
            "requests run together in one model batch",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.questions = Counter(
            "prefill_questions",
            "questions answered, by what answered them: the model, "
            "the fact pass, a shallow readout (early exit), the fallback",
            ["path"],
            registry=r,
        )
        self.input_tokens = Counter("prefill_input_tokens", "input tokens reported in responses' usage", registry=r)
        r.register(_BackendCollector(backends))

    def answered(self, d: Decision) -> None:
        n = len(d.answers)
        paths = {"fact": len(d.facts), "early_exit": len(d.early_exit), "fallback": len(d.escalated)}
        paths["model"] = n - sum(paths.values())
        for path, count in paths.items():
            self.questions.labels(path).inc(count)
        self.input_tokens.inc(d.usage.input_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountRequests:
    """ASGI middleware: every HTTP response counted by endpoint and status, and timed."""

    def __init__(self, app, telemetry: Telemetry):
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        start, status = time.perf_counter(), [500]

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.telemetry.requests.labels(endpoint, str(status[0])).inc()
            self.telemetry.latency.labels(endpoint).observe(time.perf_counter() - start)


class _BackendCollector:
    """The served backends' own counters, read at scrape time (several engines on one backend: once)."""

    def __init__(self, backends: Callable[[], Iterable]):
        self.backends = backends

    def collect(self):
        backends = {id(b): b for b in self.backends()}.values()
        for attr, name, help_text in BACKEND_COUNTERS:
            family = CounterMetricFamily(name, help_text)
            family.add_metric([], sum(getattr(b, attr, 0) for b in backends))
            yield family
        weights = GaugeMetricFamily(
            "prefill_model_weight_bytes", "the served models' weights, one copy each, in the precision served"
        )
        weights.add_metric([], sum(getattr(b, "weight_bytes", 0) for b in backends))
        yield weights
