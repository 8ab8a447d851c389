"""On a CPU without bf16 matrix units (AVX2 only, say): what each model costs in fp32, what it answers to a
newcomer's first questions, and whether int8 (PyTorch's dynamic quantisation, weights per channel, on every
linear layer of the decoder; the LM head stays fp32) would buy the larger model back. One model per run, run
alone (README "Without bf16 units"):

    python -m benchmarks.no_bf16 --model qwen2.5-coder-0.5b-instruct
    python -m benchmarks.no_bf16 --model qwen2.5-coder-1.5b-instruct

Prints, for fp32 then int8: the SemIf request (21 yes/no questions on the 400-token ticket, fresh state) and one
question, in seconds (medians of 2), seconds per newcomer request (4 questions on a short message), the
answers to them, then how far int8 moves the answers from fp32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from prefill import Prefill
from prefill.bench import STATE, nouls
from tests.test_default_model import BROKEN, NEWCOMER, THANKS, TICKET

MESSAGES = [  # what a newcomer tries first (tests/test_default_model.py), and three short sentences
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


def quantize(pf: Prefill) -> None:
    """int8 weights per output channel, activations quantised per tensor at run time (fbgemm/x86 kernels)."""
    torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    config = torch.ao.quantization.per_channel_dynamic_qconfig
    torch.ao.quantization.quantize_dynamic(
        pf.backend.model.get_decoder(), {torch.nn.Linear: config}, dtype=torch.qint8, inplace=True
    )
    pf.backend.forget_states()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    args = ap.parse_args()
    print(f"loading {args.model} in fp32 (threads: {torch.get_num_threads()})", flush=True)
    pf = Prefill(args.model, dtype="float32", calibration=None)
    ref = measure(pf, "fp32")
    print("quantising the decoder's linear layers to int8", flush=True)
    quantize(pf)
    got = measure(pf, "int8")
    gaps = [max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(ref, got)]
    agree = sum(
        max(range(len(x)), key=x.__getitem__) == max(range(len(y)), key=y.__getitem__) for x, y in zip(ref, got)
    )
    print(
        f"int8 vs fp32, {len(gaps)} answers: |dp| mean {statistics.mean(gaps):.3f}, max {max(gaps):.3f}, "
        f"top answer agrees {agree}/{len(gaps)}"
    )


if __name__ == "__main__":
    main()
