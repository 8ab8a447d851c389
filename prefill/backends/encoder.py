"""The encoder route (`--route encoder`): a bidirectional encoder (BERT-like) reads the question, one slot
per declared option and the state together, in one sequence per question.

Layout, question first (it reads better on this route: the question's tokens attend to the text below
them, and the state is the part that gets truncated, never the question):

    [CLS] question [SEP] [MASK] option 1 [MASK] option 2 ... [SEP] state [SEP]

Training-free score of an option: the dot product of the mean-pooled question span with the option's
[MASK] vector (last layer), divided by sqrt(hidden size) so that the scale does not grow with the width; the
engine's softmax over the declared options turns them into probabilities. The slot is the tokenizer's mask
token (BERT/MPNet's [MASK]; EmbeddingGemma's vocabulary has one too, <mask>, id 4, and its <bos>/<eos>
stand for [CLS]/[SEP]); a model with no mask token gets its unknown token as the slot: an arbitrary but
fixed token that text does not produce. No sentence-embedding model was trained to fill such slots, so
the training-free score is weak (at chance on the tasks measured); trained heads learn what it means.

What trained heads read as the question's decision state (`features`): the mean over its whole sequence
(question, options and text), not over the question's span. Measured on the ten-clinic routing of patients'
reviews (docs/measurements/distillation.md): a head learns the teacher's routing far better from it, since the
question's own tokens say little about the text below them.

What the route guarantees, and how:
- questions never see each other: each question is its own sequence (sequences are batched with padding
  that the attention mask hides);
- the request's option order cannot move a probability: options are laid out in a canonical order (sorted
  by their tokens), whatever order the request gives (tests: <= 1e-4 in fp32);
- positions: a sequence holds at most `max_positions` tokens (512 for BERT-style models). The state keeps
  as many of its first tokens as fit; it is never cut below half the window while options compete for
  room: options that do not fit beside that much state are split into groups (in canonical order), one
  sequence each, with the question and the state repeated (255 options work this way; their scores come
  from different sequences, so across groups they are comparable only approximately). A question that
  cannot fit with one option is refused (413). Every question whose state was cut is reported
  (`truncated`; served as `x_truncated`).
Cost: the state is read again for every question (and every group), so cost grows linearly with questions;
the decoder route reads it once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..render import Branches, _inline, render_text
from ..schema import AnyQuestion, Choice, Noul, Score
from .base import Backend, RequestTooLarge
from .cpu import pack_linears
from .tree import Features


@dataclass(frozen=True)
class Slots(Branches):
    """A question on this route: its tokens and each option's; `ordered`: a score's levels, laid out in
    their own order (it means something); a choice's and a yes/no's options are laid out sorted."""

    ordered: bool = False


class EncoderRenderer:
    """Token ids for the encoder route: the question's text, each option's text, the state's text (no
    special tokens: the backend lays them out)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.chat, self.system, self.noul_words, self.score_words = False, False, "yesno", "names"
        self.choice_words = "names"

    def _ids(self, text: str) -> tuple[int, ...]:
        return (
            tuple(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids) if text else ()
        )

    def count(self, text: str) -> int:
        return len(self._ids(text))

    def state(self, state: Any) -> list[int]:
        return list(self._ids(render_text(state)))

    def question(self, q: AnyQuestion) -> Slots:
        """The question's tokens, and each option's (declared order; noul: yes, no; score: its levels)."""
        if isinstance(q, Noul):
            text = (
                render_text(q.instructions) if q.instructions is not None else "Does the description hold for the text?"
            )
            crit = q.criteria
            yes = "yes" + (f": {_inline(crit.true)}" if crit is not None and crit.true is not None else "")
            no = "no" + (f": {_inline(crit.false)}" if crit is not None and crit.false is not None else "")
            options = [yes, no]
        elif isinstance(q, Choice):
            text = render_text(q.instructions) if q.instructions is not None else "Which option fits the text best?"
            options = [
                f"{name}: {_inline(d)}" if d is not None and _inline(d) else name for name, d in q.criteria.items()
            ]
        else:
            text = render_text(q.instructions) if q.instructions is not None else "Which level fits the text best?"
            options = [_inline(level) or str(i) for i, level in enumerate(q.criteria)]
        return Slots(self._ids(text), tuple(self._ids(o) for o in options), ordered=isinstance(q, Score))


class EncoderBackend(Backend):
    """Scores each declared option of a question by its [MASK] slot (see the module docstring)."""

    route = "encoder"
    # What trained heads read as a question's decision state: "sequence", the mean over its whole sequence, or
    # "question", over the question's span (what heads read before 2026-12-03; kept for the comparison in
    # benchmarks/training/pooling.py, which chose "sequence").
    pooling = "sequence"
    answers_by = "encoder, a [MASK] slot per option"
    reads_features = truncates = True

    def __init__(
        self,
        model,
        tokenizer,
        name: str,
        *,
        batch_size: int = 16,
    ):
        self.model = model.eval()
        self.packed_linears = pack_linears(self.model)  # bf16 on a CPU with bf16 units: see backends/cpu.py
        self.name = name
        self.renderer = EncoderRenderer(tokenizer)
        self.batch_size = batch_size
        # BERT-style [CLS]/[SEP]; a model without them (EmbeddingGemma) gets its own <bos>/<eos>, as its tokenizer does
        self.cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        self.sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        self.slot = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.unk_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        limit = getattr(tokenizer, "model_max_length", None)
        positions = model.config.max_position_embeddings - (
            2 if model.config.model_type in ("roberta", "mpnet", "xlm-roberta") else 0
        )
        self.max_positions = min(positions, limit) if limit and limit < 1_000_000 else positions
        self.max_context = 1 << 30  # long inputs are split or truncated by the layout rule, not refused
        self.device = next(model.parameters()).device
        self.forward_calls = 0
        self.tokens_run = 0
        self.truncated_questions = 0

    @property
    def depth(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def readout_features(self) -> str:  # in the readout fingerprint; "" for the question span, as heads had it
        return "sequence-mean" if self.pooling == "sequence" else ""

    # -- layout
    def layout(self, n_state: int, q: Branches) -> list[tuple[list[int], int]]:
        """The sequences a question needs: (indices of its options, in canonical order, and how many state
        tokens each keeps)."""
        fixed = 4 + len(q.prompt)  # [CLS] question [SEP] ... [SEP] state [SEP]
        order = list(range(len(q.answers)))
        if not getattr(q, "ordered", False):
            order.sort(key=lambda i: (q.answers[i], i))
        sizes = {i: 1 + len(q.answers[i]) for i in order}  # a slot and the option's tokens
        room = self.max_positions - fixed - min(n_state, self.max_positions // 2)
        if fixed + max(sizes.values()) > self.max_positions:
            raise RequestTooLarge(
                f"a question of {len(q.prompt)} tokens with its longest option does not fit the encoder's "
                f"{self.max_positions} positions"
            )
        groups, group, used = [], [], 0
        for i in order:
            if group and used + sizes[i] > room:
                groups.append(group)
                group, used = [], 0
            group.append(i)
            used += sizes[i]
        groups.append(group)
        return [(g, min(n_state, self.max_positions - fixed - sum(sizes[i] for i in g))) for g in groups]

    def truncated(self, n_state: int, q: Branches) -> bool:
        """Whether the state is cut for this question."""
        return any(kept < n_state for _, kept in self.layout(n_state, q))

    # -- the interface
    def score(self, state: Sequence[int], questions: Sequence[Branches]) -> list[list[float]]:
        return [f.loglik for f in self.features(state, questions, [])]

    @torch.inference_mode()
    def features(self, state: Sequence[int], questions: Sequence[Branches], layers: Sequence[int]) -> list[Features]:
        """Per question: the training-free slot scores (as `loglik`), and for trained heads the hidden states
        after the given layers (1-based) pooled over the question's whole sequence (`decision`; its first
        sequence when its options are split) and of each option's slot (`options`)."""
        rows = []  # (question, its option indices, token ids, slot positions, question span)
        for qi, q in enumerate(questions):
            for options, kept in self.layout(len(state), q):
                ids = [self.cls, *q.prompt, self.sep]
                slots = []
                for i in options:
                    slots.append(len(ids))
                    ids += [self.slot, *q.answers[i]]
                ids += [self.sep, *state[:kept], self.sep]
                rows.append((qi, options, ids, slots, slice(1, 1 + len(q.prompt)) if q.prompt else slice(0, 1)))
            self.truncated_questions += self.truncated(len(state), q)
        scores = [[0.0] * len(q.answers) for q in questions]
        decision: list[torch.Tensor | None] = [None] * len(questions)
        slots_at = [[None] * len(q.answers) for q in questions]
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            last, chosen = self._encode([ids for _, _, ids, _, _ in batch], layers)
            for b, (qi, options, ids, slots, span) in enumerate(batch):
                question = last[b, span].mean(0)
                for i, pos in zip(options, slots):
                    scores[qi][i] = float(question @ last[b, pos]) / math.sqrt(last.shape[-1])
                    if layers:
                        slots_at[qi][i] = chosen[b, pos]
                if layers and decision[qi] is None:
                    pooled = slice(0, len(ids)) if self.pooling == "sequence" else span
                    decision[qi] = chosen[b, pooled].mean(0)
        if not layers:
            return [Features(s, torch.empty(0), torch.empty(0)) for s in scores]
        return [Features(s, decision[qi], torch.stack(slots_at[qi])) for qi, s in enumerate(scores)]

    def _encode(self, sequences: list[list[int]], layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last layer's hidden states (batch, longest, hidden), right-padded and masked, and with `layers`
        those layers' (batch, longest, n_layers, hidden)."""
        width = max(map(len, sequences))
        ids = torch.tensor([s + [self.pad] * (width - len(s)) for s in sequences], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=self.device)
        self.forward_calls += 1
        self.tokens_run += sum(map(len, sequences))
        out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=bool(layers))
        chosen = torch.stack([out.hidden_states[i] for i in layers], dim=2).float().cpu() if layers else None
        return out.last_hidden_state.float().cpu(), chosen
