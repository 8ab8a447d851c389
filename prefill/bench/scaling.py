"""2-3 and 5. Latency and peak memory against questions, state length and options; the engine's overhead
over a bare forward; the plot."""

from __future__ import annotations

from pathlib import Path

import torch

from ..api import Prefill
from ..schema import Choice
from .measure import STATE, PeakMemory, nouls, timed, tokens_ran

# ---------------------------------------------------------------- 2. scaling


def scale_questions(pf: Prefill, counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in counts:
        qs = nouls(n)
        with PeakMemory() as mem:
            t, (_, usage) = timed(lambda: pf.engine.ask(STATE, qs), repeats if n <= 100 else 1, cold=pf)
        rows.append(
            {
                "questions": n,
                "seconds": round(t, 3),
                "tokens": usage.input_tokens,
                "ms_per_question": round(1000 * t / n, 2),
                "peak_extra_mib": mem.mib,
            }
        )
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
            rows.append(
                {
                    "state_tokens": length,
                    "questions": n,
                    "seconds": round(t, 3),
                    "tokens": usage.input_tokens,
                    "peak_extra_mib": mem.mib,
                }
            )
    return rows


def scale_options(pf: Prefill, counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for kind in ("short", "multi-token"):
        for n in counts:
            names = [
                f"Q{i:03d}" if kind == "short" else f"Queue {i:03d} for regional billing disputes" for i in range(n)
            ]
            q = {"q": Choice("Which queue should this ticket go to?", names)}
            with PeakMemory() as mem:
                t, (_, usage) = timed(lambda: pf.engine.ask(STATE, q), repeats, cold=pf)
            rows.append(
                {
                    "options": n,
                    "names": kind,
                    "seconds": round(t, 3),
                    "tokens": usage.input_tokens,
                    "peak_extra_mib": mem.mib,
                }
            )
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
    return {
        "tokens": n_tokens,
        "engine_s": round(t_engine, 3),
        "bare_forward_s": round(t_bare, 3),
        "ratio": round(t_engine / t_bare, 2),
    }


# ---------------------------------------------------------------- 5. plot


def plot(rows: list[dict], path: Path, model: str) -> None:
    from ..evaluation.evaluate import pyplot

    if (plt := pyplot(path)) is None:
        return
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
