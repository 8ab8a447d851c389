"""The loss heads train on (training.py, lora.py): cross-entropy to the target, plus the RLCD term.

Loss (RLCD, as ../shared/docs/background.md summarises the published tutorial):
  cross-entropy to the target
  + rl_weight × the RL term: G candidate score vectors s_g = s + σ ε (ε ~ N(0, I)) around the student's
    scores s; each rewarded with proper scores weighted by the target t: log score Σ t log p_g, spherical
    score t·p_g / |p_g|, and for `score` questions minus the ranked probability score; advantage
    A_g = (r_g - mean r) / std r over the group; the loss Σ_g A_g |s_g - s|² / 2σ² is the Gaussian
    policy gradient, which pulls s towards the candidates that scored better than their group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def mixed_target(n: int, gold: int, teacher: torch.Tensor | None, label_weight: float) -> torch.Tensor:
    onehot = torch.zeros(n)
    onehot[gold] = 1.0
    if teacher is None:
        return onehot
    return (1 - label_weight) * teacher + label_weight * onehot


@dataclass
class Batch:
    qtype: torch.Tensor  # (B,)
    decision: torch.Tensor  # (B, H)
    options: torch.Tensor  # (B, N, H)
    loglik: torch.Tensor  # (B, N)
    mask: torch.Tensor  # (B, N) real answers
    target: torch.Tensor  # (B, N)
    ordinal: torch.Tensor  # (B,) score questions
    answers: list[list[str]] = field(default_factory=list)  # (B, n) head.answer_key: what a classes head reads


def masked_log_softmax(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(s.masked_fill(~mask, -1e9), dim=-1)


def rewards(p: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, ordinal: torch.Tensor) -> torch.Tensor:
    """Proper scores of candidate distributions p (G, B, N) against targets t (B, N), higher is better."""
    log_score = (t * torch.log(p.clamp(min=1e-12))).sum(-1)
    spherical = (t * p).sum(-1) / p.norm(dim=-1).clamp(min=1e-12)
    n = mask.sum(-1).clamp(min=2)
    rps = ((p.cumsum(-1) - t.cumsum(-1)) ** 2 * mask).sum(-1) / (n - 1)
    return log_score + spherical - rps * ordinal


def rl_term(s: torch.Tensor, b: Batch, group: int, sigma: float) -> torch.Tensor:
    noise = torch.randn(group, *s.shape) * sigma
    candidates = s.detach()[None] + noise
    with torch.no_grad():
        p = masked_log_softmax(candidates, b.mask[None]).exp()
        r = rewards(p, b.target[None], b.mask[None], b.ordinal[None])
        advantage = (r - r.mean(0)) / r.std(0).clamp(min=1e-6)
    distance = (((candidates - s[None]) ** 2) * b.mask[None]).sum(-1) / (2 * sigma**2)
    return (advantage * distance).mean()


def objective(s: torch.Tensor, b: Batch, rl_weight: float = 0.0, group: int = 8, sigma: float = 1.0) -> torch.Tensor:
    """Soft cross-entropy of scores s (B, N) to the batch's targets, plus rl_weight × the RLCD term."""
    ce = -(b.target * masked_log_softmax(s, b.mask)).sum(-1).mean()
    return ce + rl_weight * rl_term(s, b, group, sigma) if rl_weight else ce
