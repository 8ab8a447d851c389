"""On a CPU without bf16 matrix units (AVX2 only, say): what each model costs in fp32, what it answers to a
newcomer's first questions, and what int8 on every linear layer of the decoder (weights per output channel,
activations per token: `--dtype int8`, auto there; the LM head stays fp32) costs and changes. One model per
run, run alone (docs/measurements/cpu-precision.md#without-bf16-units-int8):

    python -m benchmarks.speed.no_bf16 --model qwen2.5-coder-0.5b-instruct
    python -m benchmarks.speed.no_bf16 --model qwen2.5-coder-1.5b-instruct

Prints, for fp32 then int8: the SemIf request (21 yes/no questions on the 400-token ticket, fresh state) and one
question, in seconds (medians of 2), seconds per newcomer request (4 questions on a short message), the
answers to them, then how far int8 moves the answers from fp32, and whether an answer still does not depend on
the other questions asked with it (`--per-tensor`: the same with PyTorch's dynamic quantisation, one scale per
pass, which breaks that); last, the SemIf request and that isolation with int8's attention in fp32 instead of
float64 (`exact_attention`), alternated with float64 twice.

    python -m benchmarks.speed.no_bf16 --batched --model qwen2.5-coder-1.5b-instruct   # about a minute

only loads the model in int8 and prints how far requests batched into shared passes answer from the same
requests asked one by one, with each state run alone (as served) and with the states run side by side.

    python -m benchmarks.speed.no_bf16 --versus-bf16 --model qwen2.5-coder-1.5b-instruct  # which is faster here

int8 against bf16 on a CPU with bf16 units, both as served (exact), alternated: what `--dtype auto` should pick.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from prefill import Prefill
from prefill.backends.cpu import to_int8
from prefill.bench.measure import BROKEN, NEWCOMER, STATE, THANKS, TICKET, nouls
from prefill.bench.measure import TICKET_QUESTIONS as QUESTIONS

MESSAGES = [  # what a newcomer tries first (prefill/bench/measure.py), and three short sentences
    TICKET,
    BROKEN,
    THANKS,
    "He regularly used the 12-string guitar in performance.",
    "Je ne sais pas pourquoi le train est en retard aujourd'hui.",
    "Ich habe gestern ein neues Fahrrad gekauft und bin damit zur Arbeit gefahren.",
]


def flat(a) -> list[float]:
    return [a.noul, 1 - a.noul] if a.type == "noul" else list(a.probabilities.values())


def seconds(pf: Prefill, questions: dict, repeats: int = 2) -> float:
    times = []
    for _ in range(repeats):
        pf.backend.forget_states()
        started = time.perf_counter()
        pf.engine.ask(STATE, questions)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(pf: Prefill, label: str) -> list[list[float]]:
    pf.engine.ask(STATE, nouls(2))  # warm-up
    print(f"{label}: SemIf 21 questions {seconds(pf, nouls(21)):.2f} s, 1 question {seconds(pf, nouls(1)):.2f} s")
    started = time.perf_counter()
    answers = [pf.ask(m, NEWCOMER) for m in MESSAGES]
    per = (time.perf_counter() - started) / len(MESSAGES)
    print(f"{label}: newcomer request (4 questions on a short message) {per:.2f} s")
    for m, a in zip(MESSAGES, answers):
        print(
            f"  {m[:40]!r:44} language {a['language'].choice}, refund {a['refund'].noul:.2f}, "
            f"team {a['team'].choice}, anger {a['anger'].score:.2f}",
            flush=True,
        )
    semif = pf.engine.ask(STATE, nouls(21))[0]
    return [flat(a) for per_message in answers for a in per_message.values()] + [flat(a) for a in semif.values()]


def quantize(pf: Prefill, per_tensor: bool) -> None:
    """prefill's int8 (`--dtype int8`: weights per output channel, activations per token), or PyTorch's dynamic
    quantisation (activations per pass: one scale for every row of the pass)."""
    decoder = pf.backend.model.get_decoder()
    if per_tensor:
        config = torch.ao.quantization.per_channel_dynamic_qconfig
        torch.ao.quantization.quantize_dynamic(decoder, {torch.nn.Linear: config}, dtype=torch.qint8, inplace=True)
    else:
        to_int8(pf.backend.model)  # as `--dtype int8` loads it
    pf.backend.forget_states()


def isolation(pf: Prefill) -> float:
    """The largest |dp| between a question asked with the others (the newcomer's four and the ticket's) and
    asked alone, on the ticket."""
    asked = {**QUESTIONS, **NEWCOMER}
    together = pf.ask(TICKET, asked)
    return max(
        max(abs(a - b) for a, b in zip(flat(together[q]), flat(pf.ask(TICKET, {q: asked[q]})[q]))) for q in asked
    )


def batched_vs_one_by_one(pf: Prefill) -> float:
    """The largest |dp| between the newcomer's questions on MESSAGES asked as one batch of requests (shared
    passes, `decide_many`: the server under load) and asked one request at a time."""
    alone = [pf.engine.decide(m, NEWCOMER) for m in MESSAGES]
    pf.backend.forget_states()
    together = pf.engine.decide_many([(m, NEWCOMER, None) for m in MESSAGES])
    return max(
        max(abs(x - y) for x, y in zip(flat(a.answers[q]), flat(b.answers[q])))
        for a, b in zip(alone, together)
        for q in NEWCOMER
    )


def batched(model: str) -> None:
    from prefill.backends import causal_lm

    print(f"loading {model} in int8", flush=True)
    pf = Prefill(model, dtype="int8", calibration=None)
    print(f"int8, each state alone (served): batched vs one by one {batched_vs_one_by_one(pf):.2e}", flush=True)
    served, causal_lm.states_run_alone = causal_lm.states_run_alone, lambda model: False
    try:
        pf.backend.forget_states()
        print(f"int8, states side by side: batched vs one by one {batched_vs_one_by_one(pf):.2e}", flush=True)
    finally:
        causal_lm.states_run_alone = served


def versus_bf16(model: str, rounds: int = 4) -> None:
    """int8 against bf16 (each as `--dtype auto` would serve it: exact) on this CPU, in one run: the SemIf
    request (21 questions, fresh state) and one question, the two alternated `rounds` times; medians, and the
    resident memory each adds to the process."""
    import os

    from prefill.bench.http import rss_mib

    times: dict[tuple[str, int], list[float]] = {}
    engines = {}
    for dtype in ("bfloat16", "int8"):
        before = rss_mib(os.getpid())
        print(f"loading {model} in {dtype}", flush=True)
        engines[dtype] = Prefill(model, dtype=dtype, calibration=None)
        engines[dtype].engine.ask(STATE, nouls(2))
        print(f"  {dtype}: {rss_mib(os.getpid()) - before:.0f} MiB more resident", flush=True)
    for r in range(rounds):
        for dtype, pf in engines.items():
            for n in (21, 1):
                times.setdefault((dtype, n), []).append(seconds(pf, nouls(n)))
            print(f"round {r + 1}/{rounds}, {dtype}: {times[dtype, 21][-1]:.2f} s, {times[dtype, 1][-1]:.2f} s")
    for dtype in engines:
        print(
            f"{dtype}: SemIf 21 questions {statistics.median(times[dtype, 21]):.2f} s, "
            f"1 question {statistics.median(times[dtype, 1]):.2f} s (medians of {rounds})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--per-tensor", action="store_true", help="PyTorch's dynamic quantisation instead of prefill's")
    ap.add_argument("--batched", action="store_true", help="only: batched requests vs one by one, in int8")
    ap.add_argument("--versus-bf16", action="store_true", help="only: int8 against bf16, speed and memory, one run")
    args = ap.parse_args()
    if args.batched:
        return batched(args.model)
    if args.versus_bf16:
        return versus_bf16(args.model)
    print(f"loading {args.model} in fp32 (threads: {torch.get_num_threads()})", flush=True)
    pf = Prefill(args.model, dtype="float32", calibration=None)
    ref = measure(pf, "fp32")
    how = "activations per pass (PyTorch)" if args.per_tensor else "activations per token (prefill)"
    print(f"quantising the decoder's linear layers to int8, {how}", flush=True)
    quantize(pf, args.per_tensor)
    got = measure(pf, "int8")
    gaps = [max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(ref, got)]
    agree = sum(
        max(range(len(x)), key=x.__getitem__) == max(range(len(y)), key=y.__getitem__) for x, y in zip(ref, got)
    )
    print(
        f"int8 vs fp32, {len(gaps)} answers: |dp| mean {statistics.mean(gaps):.3f}, max {max(gaps):.3f}, "
        f"top answer agrees {agree}/{len(gaps)}"
    )
    print(f"int8, packed with 7 other questions vs alone: largest |dp| {isolation(pf):.2e}", flush=True)
    if not args.per_tensor:  # what attention in float64 buys and costs, against fp32 attention, in this run
        config, exact = pf.backend.model.config, pf.backend.model.config._attn_implementation
        for attention in ("sdpa", exact, "sdpa", exact):
            config._attn_implementation = attention
            print(f"int8, attention {attention}: SemIf 21 questions {seconds(pf, nouls(21)):.2f} s", flush=True)
        config._attn_implementation = "sdpa"
        print(f"int8, attention in fp32: packed vs alone, largest |dp| {isolation(pf):.2e}", flush=True)


if __name__ == "__main__":
    main()
