"""Rows: the way to run models whose layers ignore attention masks (recurrent or linear-attention hybrids)
and sliding-window models whose context outruns the window (backends/causal_lm.py chooses)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..render import Branches


def score_rows(backend, cache: DynamicCache, n_state: int, chunk: Sequence[Branches]) -> list[list[float]]:
    """Each (question, answer) of `chunk` as a row continuing from its own copy of the cached state: the
    answers' log-likelihoods, with no mask beyond the causal one."""
    rows = [list(q.prompt) + list(a[:-1]) for q in chunk for a in q.answers]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=backend.device)  # right padding
    row_cache = copy.deepcopy(cache)
    row_cache.batch_repeat_interleave(len(rows))
    positions = torch.arange(n_state, n_state + width, device=backend.device).expand(len(rows), -1)
    logits = backend.model(input_ids=ids, position_ids=positions, cache=row_cache, use_cache=True).logits
    backend.forward_calls += 1
    backend.tokens_run += ids.numel()
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    scores, r = [], 0
    for q in chunk:
        per_answer = []
        for a in q.answers:
            start = len(q.prompt) - 1  # the last prompt token predicts the answer's first token
            steps = torch.arange(start, start + len(a), device=backend.device)
            per_answer.append(float(logprobs[r, steps, torch.tensor(a, device=backend.device)].sum()))
            r += 1
        scores.append(per_answer)
    return scores
