"""Run by tests/test_vllm.py in the vLLM venv (.venv-vllm): the stale-row trap reproduced on vLLM itself,
and the backend shown to avoid it. Prints one JSON line.

1. vLLM's own way to score a sequence, `prompt_logprobs` with its prefix cache read: the second time the
   same sequence is sent, the rows of the positions found in the cache were never computed, and what comes
   back for them is not the first run's (uninitialised memory; vLLM issue #42019).
2. VLLMBackend scores the same questions on a cold cache, a warm one, and with a cache hit injected into
   one output that reaches the row it reads (vLLM itself never reports one: its hits stop a token short);
   the backend must catch that one and re-run it under a fresh cache_salt, and all three must agree.
"""

from __future__ import annotations

import json


def main() -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from prefill.api import Prefill
    from prefill.schema import wire_questions

    pf = Prefill("smollm2-135m-instruct", backend="vllm", calibration=None)
    backend, llm = pf.backend, pf.backend.llm

    ids = list(range(1000, 1100))  # any 100 tokens
    naive = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, skip_reading_prefix_cache=False)
    cold, warm = (llm.generate([TokensPrompt(prompt_token_ids=ids)], naive, use_tqdm=False)[0] for _ in range(2))
    wrong = sum(
        1
        for k in range(1, len(ids))
        if ids[k] not in warm.prompt_logprobs[k]
        or abs(warm.prompt_logprobs[k][ids[k]].logprob - cold.prompt_logprobs[k][ids[k]].logprob) > 1e-4
    )

    state = pf.backend.renderer.state("Hi, I was charged twice for order 5512 and the parcel arrived damaged.")
    questions = [
        pf.backend.renderer.question(q)
        for q in wire_questions(
            {
                "refund": {"type": "noul", "instructions": "Does the customer want money back?"},
                "queue": {
                    "type": "choice",
                    "instructions": "Which queue?",
                    "criteria": dict.fromkeys(["fraud", "fraud review", "billing", "billing error"]),
                },
            }
        ).values()
    ]
    before = backend.tokens_run
    scores_cold = backend.score(state, questions)
    cold_tokens = backend.tokens_run - before
    scores_warm = backend.score(state, questions)
    warm_tokens = backend.tokens_run - before - cold_tokens

    generate = llm.generate

    def one_stale_hit(prompts, params, **kw):  # the next call's first output: a whole-sequence hit, stale rows
        outputs = generate(prompts, params, **kw)
        if len(outputs) > 1:
            outputs[0].num_cached_tokens = len(outputs[0].prompt_token_ids)
            for logprob in outputs[0].outputs[0].logprobs[0].values():
                logprob.logprob = 0.0
            llm.generate = generate
        return outputs

    llm.generate = one_stale_hit
    scores_injected = backend.score(state, questions)
    gap = max(
        abs(a - b) for s in (scores_warm, scores_injected) for qa, qb in zip(scores_cold, s) for a, b in zip(qa, qb)
    )
    print(
        json.dumps(
            {
                "trap_rows_wrong": wrong,
                "trap_rows": len(ids) - 1,
                "backend_max_gap": gap,
                "stale_reruns": backend.stale_reruns,
                "cold_tokens": cold_tokens,
                "warm_tokens": warm_tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
