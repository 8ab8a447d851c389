"""Trained readouts: small heads over the frozen model's hidden states, instead of (or beside) its LM head.

Four kinds, all reading the packed pass's hidden states (backends.causal_lm.Features), so packing,
isolation and every invariance of the training-free path hold for them too:

- linear:  s_o = w · norm(h_o)                           (h_o: the hidden state at answer o's end token)
- pointer: s_o = (Q norm(h_dec)) · (K norm(h_o)) / √r     (h_dec: the decision token, where the answer starts;
                                                          on the encoder route the question's sequence pooled)
- mlp:     s_o = w₂ · gelu(W₁ norm(h_o) + b₁)             (a small MLP, r hidden units; measured:
                                                          docs/measurements/single-task.md)
- classes: s_o = w_o · norm(h_dec) + b_o                 (a weight vector per answer it was taught, by type and
                                                          name; an answer it was not taught scores 0, as an
                                                          untrained head does)

plus, when the head reads the last layer, α_type · loglik_o, the training-free score, with α starting at 1
and the head at 0: an untrained readout answers exactly like the plain engine, and training only moves it
where the data says so. A head on an intermediate layer has no log-likelihood to lean on (the LM head
reads the last layer only); it is what early exit uses.

Why classes: the other three score an answer from its own hidden state (or compare it with the decision's
through a low rank), and must learn from the data what the answer's tokens mean; a weight vector per answer
is the plain classifier over the question's state, which a few hundred rows teach where the others stay near
chance (eight languages on EmbeddingGemma: docs/measurements/distillation.md). It serves only the answers it was taught:
a head for a user's own fixed questions.

Each head also carries a temperature per question type, fitted by `prefill train` on predictions for
families the head did not see, and applied whenever it scores.

A readout file is safetensors (the weights and temperatures) plus JSON (the config, the base model's
fingerprint, how it was trained and what it scored), refused by any other base model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .settings import HEAD_KINDS

TYPES = ("noul", "choice", "score")
KINDS = HEAD_KINDS


def answer_key(qtype: str, label: str) -> str:
    """What a classes head knows an answer by: its question's type and its name ("choice:French")."""
    return f"{qtype}:{label}"


@dataclass
class HeadConfig:
    kind: str  # linear | pointer | mlp | classes
    layer: int  # the decoder layer it reads (1-based; the last layer = the model's depth)
    hidden: int
    use_base: bool  # adds α · log-likelihood (only possible on the last layer)
    model: str = ""
    fingerprint: str = ""
    rank: int = 64
    exit_threshold: float | None = None  # early exit: stop at this head when its confidence clears this
    adapter: str | None = None  # a LoRA trained with this head (lora.py): a folder beside its file
    notes: dict = field(default_factory=dict)
    answers: list[str] = field(default_factory=list)  # classes: the answers it was taught (answer_key)


class Head(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        if cfg.kind not in KINDS:
            raise ValueError(f"readout kind must be one of {', '.join(KINDS)}, not {cfg.kind!r}")
        self.cfg = cfg
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False)
        if cfg.kind == "linear":
            self.w = nn.Parameter(torch.zeros(cfg.hidden))
        elif cfg.kind == "mlp":  # w2 starts at 0: an untrained head still answers like the plain engine
            self.w1 = nn.Parameter(torch.randn(cfg.rank, cfg.hidden) / math.sqrt(cfg.hidden))
            self.b1 = nn.Parameter(torch.zeros(cfg.rank))
            self.w2 = nn.Parameter(torch.zeros(cfg.rank))
        elif cfg.kind == "classes":
            self.table = nn.Parameter(torch.zeros(len(cfg.answers), cfg.hidden))
            self.bias = nn.Parameter(torch.zeros(len(cfg.answers)))
            self.known = {a: i for i, a in enumerate(cfg.answers)}
        else:
            self.q = nn.Parameter(torch.randn(cfg.rank, cfg.hidden) / math.sqrt(cfg.hidden) * 0.01)
            self.k = nn.Parameter(torch.randn(cfg.rank, cfg.hidden) / math.sqrt(cfg.hidden) * 0.01)
        self.alpha = nn.Parameter(
            torch.ones(len(TYPES)) if cfg.use_base else torch.zeros(len(TYPES)), requires_grad=cfg.use_base
        )
        # Per-type temperatures, fitted after training on predictions for families the head did not see
        # (fitting.fit_head); 1 while training.
        self.register_buffer("temperature", torch.ones(len(TYPES)))

    def forward(
        self,
        qtype: torch.Tensor,
        decision: torch.Tensor,
        options: torch.Tensor,
        loglik: torch.Tensor,
        answers: Sequence[Sequence[str]] = (),
    ) -> torch.Tensor:
        """Scores (logits over the declared answers) for a batch: qtype (B,), decision (B, H), options
        (B, N, H), loglik (B, N), answers (B lists of answer_key; what a classes head reads); padded
        answers are the caller's to mask."""
        h = self.norm(options)
        if self.cfg.kind == "classes":
            s = self._classes(decision, answers, options.shape[1])
        elif self.cfg.kind == "linear":
            s = h @ self.w
        elif self.cfg.kind == "mlp":
            s = torch.nn.functional.gelu(h @ self.w1.T + self.b1) @ self.w2
        else:
            s = torch.einsum("br,bnr->bn", self.norm(decision) @ self.q.T, h @ self.k.T) / math.sqrt(self.cfg.rank)
        if self.cfg.use_base:
            s = s + self.alpha[qtype, None] * loglik
        return s / self.temperature[qtype, None]

    def _classes(self, decision: torch.Tensor, answers: Sequence[Sequence[str]], n: int) -> torch.Tensor:
        """Each answer's own weight vector against the decision state; 0 for an answer not taught (the
        zero column appended at the end)."""
        untaught = len(self.cfg.answers)
        index = torch.full((len(decision), n), untaught, dtype=torch.long)
        for b, keys in enumerate(answers):
            index[b, : len(keys)] = torch.tensor([self.known.get(k, untaught) for k in keys], dtype=torch.long)
        s = self.norm(decision) @ self.table.T + self.bias
        return torch.cat([s, s.new_zeros(len(s), 1)], dim=1).gather(1, index)

    def score(
        self, qtype: str, decision: torch.Tensor, options: torch.Tensor, loglik, labels: Sequence[str] = ()
    ) -> list[float]:
        """One question's scores: decision (H,), options (N, H), labels (its answers' names, in order)."""
        with torch.no_grad():
            t = torch.tensor([TYPES.index(qtype)])
            ll = torch.tensor([loglik], dtype=torch.float32).clamp(min=-1e4)
            keys = [[answer_key(qtype, label) for label in labels]]
            return self(t, decision[None].float(), options[None].float(), ll, keys)[0].tolist()

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(path.with_suffix(".safetensors"))
        )
        path.with_suffix(".json").write_text(json.dumps(asdict(self.cfg), indent=2))

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None) -> Head:
        path = Path(path)
        cfg = HeadConfig(**json.loads(path.with_suffix(".json").read_text()))
        if fingerprint is not None and cfg.fingerprint != fingerprint:
            (weights, _, reads), (served, _, gives) = cfg.fingerprint.partition("+"), fingerprint.partition("+")
            if weights == served:  # the same weights, other features (the encoder route's pooling changed)
                raise ValueError(
                    f"{path} was trained on {cfg.model!r} reading other features than this prefill gives its heads "
                    f"({reads or 'an earlier version'}, now {gives or 'an earlier version'}): train it again"
                )
            raise ValueError(
                f"{path} was trained on model {cfg.model!r} ({cfg.fingerprint[:16]}), "
                f"not on the model being served ({fingerprint[:16]})"
            )
        head = cls(cfg)
        head.load_state_dict(load_file(str(path.with_suffix(".safetensors"))))
        return head.eval()


@dataclass
class Heads:
    """What the engine serves with: the final head, optionally a shallower one for early exit, and the LoRA
    adapter trained with the final head, if any (merged into the backend's weights by the Engine it is
    given to)."""

    final: Head
    early: Head | None = None
    name: str = ""
    adapter: Path | None = None

    @property
    def layers(self) -> list[int]:
        return [self.final.cfg.layer]

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None) -> Heads:
        """`path`: a readout file (its .json or .safetensors), or a folder holding final.* and maybe early.*"""
        path = Path(path)
        if path.is_dir():
            early = path / "early.json"
            final = Head.load(path / "final.json", fingerprint)
            return cls(
                final, Head.load(early, fingerprint) if early.is_file() else None, path.name, _adapter(path, final)
            )
        final = Head.load(path, fingerprint)
        return cls(final, None, path.stem, _adapter(path.parent, final))


def _adapter(folder: Path, head: Head) -> Path | None:
    if head.cfg.adapter is None:
        return None
    path = folder / head.cfg.adapter
    if not (path / "adapter_config.json").is_file():
        raise ValueError(f"{folder}: the readout was trained with the LoRA adapter {path}, which is missing")
    return path
