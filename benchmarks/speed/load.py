"""Load test: `prefill serve` under closed- and open-loop load, over loopback only, bounded in time.

Starts the server itself (one process per setting, the given model), then measures:
1. throughput: N closed-loop clients (each sends its next request when the last is answered) for
   `--seconds`, at each `--concurrency`, with cross-request batching on and off (one server each, both up,
   runs interleaved `--repeats` times and pooled, so that drift in the machine's speed cannot pass for a
   difference): requests/s, p50/p99;
2. sustained: `--sustain` seconds at the server's capacity (`--sustain-clients` closed-loop clients, as
   many as the default queue holds, keep it busy; batching as served by default): every request must be
   answered (0 errors, 0 refusals);
3. overload: open-loop arrivals at `--overload`x the capacity measured in 1 (Poisson, seeded) for
   `--overload-seconds`: refusals must be 429/503 with Retry-After and TypeSafe's error shape and arrive
   fast, accepted requests' latency stays bounded (by the queue deadline), the server's memory stays
   bounded and the server is alive afterwards.

Every request asks three questions (yes/no, choice, score) about a different short support message, so the
state cache does not make the load easier than real traffic.

    python -m benchmarks.speed.load --out out/load.json   # docs/measurements/serving-under-load.md's tables (~7 min)
    python -m benchmarks.speed.load --seconds 5 --repeats 1 --concurrency 1,4 --sustain 10 \
        --overload-seconds 10 --batching on
    python -m benchmarks.speed.load --batching on --against "--replicas 2" --sustain 0 --overload-seconds 0  # Ray Serve
    python -m benchmarks.speed.load --batching on --against "--backend vllm" --against-python .venv-vllm/bin/python \
        --seconds 30 --repeats 1 --sustain 0 --overload-seconds 0                                      # vLLM
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

from prefill.bench.http import model_tokens, rss_mib, served
from prefill.serving.scheduler import DEFAULT_MAX_QUEUE

MESSAGES = [
    "I was charged twice for my March invoice and still have no refund.",
    "The app crashes every time I open the settings page since the update.",
    "Thank you, the replacement arrived today and works perfectly.",
    "My parcel has been stuck in transit for nine days, where is it?",
    "Cancel my subscription now or I will dispute the charge with my bank.",
    "Can I upgrade to the team plan halfway through the month?",
    "The password reset e-mail never arrives, I tried five times.",
    "Great support last week, just wanted to say thanks to Anna.",
]
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this message?",
        "criteria": {
            "Billing": "payments, invoices, refunds",
            "Technical": "bugs, errors, log-in",
            "Shipping": "deliveries and parcels",
            "Sales": "plans and upgrades",
        },
    },
    "anger": {
        "type": "score",
        "instructions": "How angry is the customer?",
        "criteria": ["Calm", "Annoyed", "Angry", "Furious"],
    },
}
REFUSED = (429, 503)


def payload(i: int) -> dict:
    return {
        "model": "jev-latest",
        "state": f"Ticket #{1000 + i}: {MESSAGES[i % len(MESSAGES)]}",
        "questions": QUESTIONS,
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


class Results:
    def __init__(self):
        self.latency: dict[str, list[float]] = {"ok": [], "refused": [], "dropped": [], "error": []}
        self.statuses: dict[int, int] = {}
        self.bad_refusals: list[str] = []
        self.seconds = 0.0

    async def send(self, client: httpx.AsyncClient, i: int) -> float:
        """Sends one request and records the outcome; returns the Retry-After of a refusal (else 0)."""
        start = time.perf_counter()
        try:
            r = await client.post("/v1/systemone", json=payload(i))
            status = r.status_code
        except httpx.HTTPError as e:
            self.latency["error"].append(time.perf_counter() - start)
            self.statuses[-1] = self.statuses.get(-1, 0) + 1
            self.bad_refusals.append(f"transport: {type(e).__name__}")
            return 0.0
        seconds = time.perf_counter() - start
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 200:
            answers = r.json()["answers"]
            ok = set(answers) == set(QUESTIONS)
            self.latency["ok" if ok else "error"].append(seconds)
        elif status in REFUSED:  # 429 at the door; 503 after waiting out the deadline
            self.latency["refused" if status == 429 else "dropped"].append(seconds)
            detail = r.json().get("detail", {})
            if not (r.headers.get("retry-after", "").isdigit() and {"error_type", "message"} <= set(detail)):
                self.bad_refusals.append(f"{status} without Retry-After or the error shape: {r.text[:200]}")
                return 1.0
            return float(r.headers["retry-after"])
        else:
            self.latency["error"].append(seconds)
            self.bad_refusals.append(f"{status}: {r.text[:200]}")
        return 0.0

    def summary(self, seconds: float) -> dict:
        ok = self.latency["ok"]
        refused = len(self.latency["refused"]) + len(self.latency["dropped"])
        return {
            "answered": len(ok),
            "refused": refused,
            "errors": len(self.latency["error"]),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "requests_per_s": round(len(ok) / seconds, 3),
            "p50_s": pct(ok, 0.5),
            "p99_s": pct(ok, 0.99),
            "refused_p50_s": pct(self.latency["refused"], 0.5),
            "refused_p99_s": pct(self.latency["refused"], 0.99),
            "dropped_p99_s": pct(self.latency["dropped"], 0.99),
            "problems": self.bad_refusals[:5],
        }


async def closed_loop(url: str, clients: int, seconds: float, first: int = 0, results: Results | None = None) -> dict:
    """`clients` clients, each sending its next request when its last one is answered (or, refused, after
    the Retry-After it was given, as the official SDK does), for `seconds`. With `results`, the outcomes
    are added to those of earlier runs (and `seconds` to theirs)."""
    results, counter = results or Results(), iter(range(first, 10**9))
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=clients + 4)) as c:

        async def client() -> None:
            while time.monotonic() < stop:
                await asyncio.sleep(await results.send(c, next(counter)))

        start = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
    results.seconds += time.monotonic() - start
    return results.summary(results.seconds)


async def open_loop(url: str, rate: float, seconds: float, seed: int = 0) -> dict:
    """Poisson arrivals at `rate` requests/s for `seconds`, whatever the server's answers: overload."""
    rng, results, tasks = random.Random(seed), Results(), []
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=None)) as c:
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.ensure_future(results.send(c, 50_000 + i)))
            i += 1
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    out = results.summary(time.monotonic() - start)
    out["sent"] = i
    return out


async def watched(pid: int, work) -> tuple[dict, float]:
    """`work`'s result and the server's largest resident memory (MiB) while it ran."""
    peak = rss_mib(pid)

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.25)

    watcher = asyncio.ensure_future(watch())
    try:
        return await work, round(peak, 1)
    finally:
        watcher.cancel()


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="the served model (default: prefill's default)")
    p.add_argument("--concurrency", default="1,4,16", help="closed-loop clients, comma-separated")
    p.add_argument("--seconds", type=float, default=15, help="each throughput run's length")
    p.add_argument("--repeats", type=int, default=2, help="throughput runs per setting, interleaved and pooled")
    p.add_argument("--batching", default="both", choices=["both", "on", "off"])
    p.add_argument("--sustain", type=float, default=60, help="seconds at capacity (0: skip)")
    p.add_argument(
        "--sustain-clients",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help="closed-loop clients for the sustained run (default: as many as the default queue holds)",
    )
    p.add_argument("--overload", type=float, default=4.0, help="open-loop arrival rate, times the capacity")
    p.add_argument("--overload-seconds", type=float, default=60, help="(0: skip)")
    p.add_argument("--serve-args", default="", help="further `prefill serve` options, e.g. '--max-queue 8'")
    p.add_argument(
        "--against",
        default=None,
        help="also measure `prefill serve AGAINST` (e.g. '--replicas 2'), "
        "as the setting 'against', interleaved with the others",
    )
    p.add_argument(
        "--against-python",
        default=sys.executable,
        help="the Python that runs the 'against' server (e.g. .venv-vllm/bin/python for '--backend vllm')",
    )
    p.add_argument("--out", default=None, help="write the results here as JSON")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = ["on", "off"] if args.batching == "both" else [args.batching]
    if args.against:
        modes.append("against")
    report: dict = {"model": args.model or "default", "cpus": os.cpu_count(), "throughput": []}
    with contextlib.ExitStack() as stack:
        servers = {}
        for mode in modes:  # all up at once; only one is ever under load, so they do not slow each other
            say(f"starting prefill serve (batching {mode})")
            extra = args.against.split() if mode == "against" else ["--batching", mode]
            python = args.against_python if mode == "against" else sys.executable
            servers[mode] = stack.enter_context(served(args.model, *extra, *args.serve_args.split(), python=python))
            asyncio.run(closed_loop(servers[mode][0], 1, 0.1))  # warm-up: the first request pays one-off costs
        for n in levels:
            pooled = {mode: Results() for mode in modes}
            tokens = dict.fromkeys(modes, 0.0)
            for rep in range(args.repeats):  # interleaved, so drift in the machine's speed hits both alike
                for mode in modes:
                    say(
                        f"throughput: {n} clients, batching {mode}, {args.seconds:.0f} s (run {rep + 1}/{args.repeats})"
                    )
                    before = model_tokens(servers[mode][0])
                    row = asyncio.run(
                        closed_loop(servers[mode][0], n, args.seconds, n * 1000 + rep * 100_000, pooled[mode])
                    )
                    tokens[mode] += model_tokens(servers[mode][0]) - before
            for mode in modes:
                row = {
                    **pooled[mode].summary(pooled[mode].seconds),
                    "clients": n,
                    "batching": mode,
                    "model_tokens_per_request": round(tokens[mode] / max(1, len(pooled[mode].latency["ok"]))),
                }
                report["throughput"].append(row)
                say(
                    f"  {n} clients, batching {mode}: {row['requests_per_s']} requests/s, p50 {row['p50_s']} s, "
                    f"p99 {row['p99_s']} s, errors {row['errors']}, refused {row['refused']}, "
                    f"{row['model_tokens_per_request']} model tokens per request"
                )
        capacity = max(r["requests_per_s"] for r in report["throughput"] if r["batching"] == modes[0])
        url, pid = servers[modes[0]]
        if args.sustain:
            n = args.sustain_clients
            say(f"sustained: {n} clients at capacity for {args.sustain:.0f} s (batching {modes[0]})")
            row, peak = asyncio.run(watched(pid, closed_loop(url, n, args.sustain, first=900_000)))
            report["sustained"] = {**row, "clients": n, "seconds": args.sustain, "peak_rss_mib": peak}
            say(
                f"  {row['answered']} answered, errors {row['errors']}, refused {row['refused']}, "
                f"p50 {row['p50_s']} s, p99 {row['p99_s']} s, peak RSS {peak} MiB"
            )
        if args.overload_seconds:
            rate = args.overload * capacity
            say(
                f"overload: {rate:.2f} requests/s ({args.overload}x capacity {capacity}) for "
                f"{args.overload_seconds:.0f} s, open loop"
            )
            rss_before = rss_mib(pid)
            row, peak = asyncio.run(watched(pid, open_loop(url, rate, args.overload_seconds)))
            alive = httpx.get(url + "/health", timeout=10).status_code == 200
            report["overload"] = {
                **row,
                "rate": round(rate, 3),
                "seconds": args.overload_seconds,
                "rss_before_mib": round(rss_before, 1),
                "peak_rss_mib": peak,
                "alive_after": alive,
            }
            say(
                f"  sent {row['sent']}: {row['answered']} answered (p50 {row['p50_s']} s, p99 {row['p99_s']} s), "
                f"{row['refused']} refused (p99 {row['refused_p99_s']} s), errors {row['errors']}, "
                f"peak RSS {peak} MiB (before {rss_before:.0f}), alive after: {alive}"
            )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
