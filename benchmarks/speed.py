"""Speed, measured as ratios in one run: same model, same machine, after warm-up, median of several runs.

1. The SemIf protocol: 21 yes/no questions on one ~400-token state. prefill (one request) against
   - generating all 21 answers as one JSON object with the same model (greedy `generate`, KV cache on), and
   - one prefill request per question (each re-reading the state).
   Reports latency, tokens processed, and how often the answers agree with prefill's.
2. Overhead: the engine against a bare model forward over the same number of tokens.
3. Scaling: latency and peak memory against the number of questions on one state.

    python -m benchmarks.speed                   # the default model
    python -m benchmarks.speed --quick           # a smoke run (CI runs this on a tiny model)
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import time

import torch

from prefill import Prefill
from prefill.schema import Noul

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


def median_time(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def generate_json(pf: Prefill, state: str, questions: list[str], max_new_tokens: int) -> tuple[dict, int, int]:
    """The vanilla-decode baseline: ask for one JSON object with every answer, greedy, KV cache on."""
    tok = pf.backend.renderer.tokenizer
    listing = "\n".join(f"{i + 1}. {q}" for i, q in enumerate(questions))
    prompt = (f"Text:\n{state}\n\nAnswer each question about the text with true or false. Reply with one JSON object "
              f'mapping each question number to true or false, like {{"1": true, "2": false}}.\n\n{listing}')
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    with torch.inference_mode():
        out = pf.backend.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                        pad_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    parsed = {int(k): v.lower() == "true" for k, v in re.findall(r'"?(\d+)"?\s*:\s*(true|false)', text, re.I)}
    return parsed, int(ids.shape[1]), int(out.shape[1] - ids.shape[1])


def semif(pf: Prefill, repeats: int, n_questions: int, max_new_tokens: int) -> dict:
    questions = {f"q{i}": Noul(q) for i, q in enumerate(QUESTIONS[:n_questions])}
    t_one, (answers, usage) = median_time(lambda: pf.engine.ask(STATE, questions), repeats)
    t_each, each = median_time(lambda: [pf.engine.ask(STATE, {k: q}) for k, q in questions.items()], repeats)
    tokens_each = sum(u.input_tokens for _, u in each)
    t_gen, (parsed, prompt_tokens, new_tokens) = median_time(
        lambda: generate_json(pf, STATE, QUESTIONS[:n_questions], max_new_tokens), max(1, repeats // 2))
    ours = [answers[f"q{i}"].noul >= 0.5 for i in range(n_questions)]
    agree = sum(parsed.get(i + 1) == ours[i] for i in range(n_questions))
    return {
        "questions": n_questions,
        "prefill_s": round(t_one, 3), "prefill_tokens": usage.input_tokens,
        "per_question_requests_s": round(t_each, 3), "per_question_tokens": tokens_each,
        "generate_json_s": round(t_gen, 3), "generate_prompt_tokens": prompt_tokens, "generate_new_tokens": new_tokens,
        "generate_answers_parsed": len(parsed), "generate_agrees_with_prefill": agree,
        "speedup_vs_generate": round(t_gen / t_one, 2), "speedup_vs_per_question": round(t_each / t_one, 2),
    }


def overhead(pf: Prefill, repeats: int, n_questions: int) -> dict:
    """The engine against one bare causal forward over as many tokens as the engine processes."""
    questions = {f"q{i}": Noul(q) for i, q in enumerate(QUESTIONS[:n_questions])}
    t_engine, (_, usage) = median_time(lambda: pf.engine.ask(STATE, questions), repeats)
    ids = torch.randint(0, pf.backend.model.config.vocab_size, (1, usage.input_tokens))

    def bare():
        with torch.inference_mode():
            return pf.backend.model(input_ids=ids, logits_to_keep=1)
    t_bare, _ = median_time(bare, repeats)
    return {"tokens": usage.input_tokens, "engine_s": round(t_engine, 3), "bare_forward_s": round(t_bare, 3),
            "ratio": round(t_engine / t_bare, 2)}


def scaling(pf: Prefill, counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in counts:
        questions = {f"q{i}": Noul(QUESTIONS[i % len(QUESTIONS)] + f" (item {i})") for i in range(n)}
        t, (_, usage) = median_time(lambda: pf.engine.ask(STATE, questions), repeats if n <= 100 else 1)
        rows.append({"questions": n, "seconds": round(t, 3), "tokens": usage.input_tokens,
                     "peak_rss_mib_so_far": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024})
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--counts", default="1,5,21,100,1000,5000")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 questions, 1 repeat, short generation")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    pf = Prefill(args.model)
    n_q, repeats, max_new = (3, 1, 8) if args.quick else (len(QUESTIONS), args.repeats, 160)
    counts = [1, 3] if args.quick else [int(c) for c in args.counts.split(",")]
    report = {"model": pf.name, "threads": torch.get_num_threads(),
              "semif": semif(pf, repeats, n_q, max_new),
              "overhead": overhead(pf, repeats, n_q),
              "scaling": scaling(pf, counts, repeats)}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
