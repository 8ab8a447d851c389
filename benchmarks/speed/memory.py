"""Resident memory of `prefill serve` as a user starts it: after load (its warm-up included), after a run of mixed
requests, and at its peak, against the size of its weights in the precision it serves them.

Each run starts its own server (`--serve` arguments, repeatable: one server after the other, never two at once,
so that each is measured alone), then sends `--requests` requests from 4 concurrent clients: states from a
sentence to ~1,500 tokens, 1 to 21 questions of every type (a 40-option choice, options that share first tokens,
multi-token options, scores, nouls with criteria), drawn with a fixed seed so every server gets the same
requests. Memory is read from /proc: VmRSS after load, after the run and 5 s later (what a burst leaves behind),
and VmHWM, the peak.

    python -m benchmarks.speed.memory                                    # the default server, 1,000 requests
    python -m benchmarks.speed.memory --serve "" --serve "--exact off" --serve "--dtype int8"
    python -m benchmarks.speed.memory --requests 100 --out out/memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shlex
import sys
import time
from pathlib import Path

import httpx

from prefill.bench.http import rss_mib, served
from prefill.bench.measure import STATE, TICKET, TICKET_QUESTIONS, nouls

from .load import MESSAGES
from .load import QUESTIONS as SUPPORT

CATEGORIES = [
    "groceries", "restaurants", "fuel", "travel", "hotels", "airlines", "electronics", "clothing", "jewellery",
    "gambling", "crypto exchange", "money transfer", "gift cards", "subscriptions", "streaming", "gaming",
    "pharmacy", "healthcare", "insurance", "utilities", "telecom", "education", "charity", "government",
    "parking", "tolls", "car rental", "ride sharing", "public transport", "home improvement", "furniture",
    "pet supplies", "sporting goods", "books", "music", "software", "cloud services", "advertising",
    "consulting", "other",
]  # fmt: skip
EXTRA = {
    "category": {
        "type": "choice",
        "instructions": "Which merchant category is this about?",
        "criteria": dict.fromkeys(CATEGORIES),
    },
    "fraud": {
        "type": "choice",
        "instructions": "How should this case be filed?",
        "criteria": dict.fromkeys(["fraud", "fraud review", "not fraud"]),
    },
    "chinese": {"type": "noul", "instructions": "客户是否要求退款？"},
    "urgent": {
        "type": "noul",
        "instructions": "Is this urgent?",
        "criteria": {"true": "money lost, an outage, a deadline today", "false": "anything else"},
    },
}


def weights_mib(url: str) -> float:
    """The served model's weights, one copy each, in the precision it serves them (`prefill_model_weight_bytes`)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(re.search(r"^prefill_model_weight_bytes (\S+)$", text, re.M).group(1)) / 2**20


def pool() -> tuple[list[str], list[tuple[str, dict]]]:
    long = " ".join(MESSAGES * 12)  # ~1,500 tokens
    states = [*MESSAGES, STATE, TICKET, long]
    questions = [*SUPPORT.items(), *EXTRA.items()]
    questions += [(f"ticket {qid}", q.model_dump(exclude_none=True)) for qid, q in TICKET_QUESTIONS.items()]
    questions += [(f"semif {qid}", q.model_dump(exclude_none=True)) for qid, q in nouls(21).items()]
    return states, questions


def requests(n: int, seed: int = 0) -> list[dict]:
    """`n` requests, each valid on the wire (checked here: a request refused with a 422 would cost nothing)."""
    from prefill.schema import SystemOneRequest

    states, questions = pool()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        asked = dict(rng.sample(questions, rng.randint(1, min(21, len(questions)))))
        out.append({"model": "jev-latest", "state": f"Case {i}: {rng.choice(states)}", "questions": asked})
        SystemOneRequest.model_validate(out[-1])
    return out


async def send_all(url: str, bodies: list[dict], clients: int = 4) -> dict[int, int]:
    statuses: dict[int, int] = {}
    queue = list(enumerate(bodies))
    done = 0
    started = time.monotonic()

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal done
        while queue:
            _, body = queue.pop(0)
            r = await http.post(f"{url}/v1/systemone", json=body, timeout=600)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            done += 1
            if done % 50 == 0 or done == len(bodies):
                rate = done / (time.monotonic() - started)
                print(f"  {done}/{len(bodies)} requests, {rate:.1f}/s", file=sys.stderr, flush=True)

    async with httpx.AsyncClient() as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return statuses


def measure(serve: str, n: int, model: str | None) -> dict:
    extra = shlex.split(serve)
    print(f"memory: starting prefill serve {serve or '(defaults)'}", file=sys.stderr, flush=True)
    with served(model, *extra) as (url, pid):
        described = httpx.get(f"{url}/v1/models", timeout=10).json()["models"][0]
        loaded, weights = rss_mib(pid), weights_mib(url)
        print(
            f"  loaded: {loaded:.0f} MiB resident, weights {weights:.0f} MiB; {n} requests", file=sys.stderr, flush=True
        )
        statuses = asyncio.run(send_all(url, requests(n)))
        after = rss_mib(pid)
        time.sleep(5)
        settled, peak = rss_mib(pid), rss_mib(pid, "VmHWM")
    return {
        "serve": serve,
        "model": described.get("description") or described["name"],
        "requests": n,
        "weights_mib": round(weights),
        "statuses": statuses,
        "rss_after_load_mib": round(loaded),
        "rss_after_requests_mib": round(after),
        "rss_5s_later_mib": round(settled),
        "peak_mib": round(peak),
        "after_load_x_weights": round(loaded / weights, 2),
        "after_requests_x_weights": round(after / weights, 2),
        "peak_x_weights": round(peak / weights, 2),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="append", help='prefill serve arguments, one server each (default: "")')
    ap.add_argument("--model", default=None, help="the served model (default: prefill serve's)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    results = []
    for i, serve in enumerate(args.serve or [""], 1):
        print(f"[{i}/{len(args.serve or [''])}]", file=sys.stderr, flush=True)
        results.append(measure(serve, args.requests, args.model))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
