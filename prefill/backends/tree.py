"""The token tree of a packed pass: a chunk of questions laid out as one sequence whose attention mask lets
a token see the state and its own ancestors only (backends/causal_lm.py says why), and what is read off it:
each answer's log-likelihood and the hidden states trained readouts read."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from ..render import Branches


@dataclass
class Features:
    """What a trained readout reads for one question: hidden states after the given decoder layers at the
    decision token (the prompt's last token, where the answer starts) and at each answer's end token (its
    last token before the end-of-answer marker), and the answers' log-likelihoods (from the last layer the
    pass ran; meaningful only for a full-depth pass)."""

    loglik: list[float]
    decision: torch.Tensor  # (n_layers, hidden)
    options: torch.Tensor  # (n_answers, n_layers, hidden)


class Tree:
    """A chunk of questions laid out as one sequence. Question prompts form a trie: prompts that begin
    with the same tokens share those tokens' nodes (same tokens, same positions, same ancestors: the
    same computation, done once), so "\n\nQuestion: Does the customer ..." is read once for every
    question that starts so. Under each prompt, each answer's tokens but the last (the last one is only
    predicted, never read from). A token sees exactly its ancestors."""

    def __init__(self):
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.parent: list[int] = []  # the node this one continues (-1: the state)
        self.read_from: list[int] = []  # sequence indices whose logits are read (deduplicated)
        self.targets: list[tuple[int, int, int, int]] = []  # (read index, token, question, answer)
        self.n_answers: list[int] = []
        self.decision: list[int] = []  # per question: its prompt's last token
        self.option_end: list[list[int]] = []  # per question, per answer: its last token before the marker
        self.nodes: list[list[int]] = []  # per question: its nodes, prompt then answers, in order
        self.group: list[int] = []  # which state the node continues (several only in score_many)
        self._group = 0
        self._slot: dict[int, int] = {}
        self._children: dict[tuple[int, int], int] = {}  # (parent, token) -> prompt node; roots: -1 - group

    @classmethod
    def build(
        cls, chunk: Sequence[Branches], n_state: int | Sequence[int], groups: Sequence[int] | None = None
    ) -> Tree:
        """`n_state`: the state's length, or each question's state's length when `groups` says which state
        each question continues (questions on different states never share nodes)."""
        t = cls()
        lengths = [n_state] * len(chunk) if isinstance(n_state, int) else list(n_state)
        groups = groups or [0] * len(chunk)
        for qi, q in enumerate(chunk):
            nodes, prev, n_state, t._group = [], -1, lengths[qi], groups[qi]
            for k, tok in enumerate(q.prompt):
                shared = t._children.get((prev if prev >= 0 else -1 - t._group, tok))
                prev = shared if shared is not None else t._add(tok, n_state + k, prev, shareable=True)
                nodes.append(prev)
            prompt_end = prev
            t.n_answers.append(len(q.answers))
            t.decision.append(prompt_end)
            t.option_end.append([])
            for ai, answer in enumerate(q.answers):
                prev = prompt_end
                for k, tok in enumerate(answer):
                    t.targets.append((t._read(prev), tok, qi, ai))
                    if k < len(answer) - 1:
                        prev = t._add(tok, n_state + len(q.prompt) + k, prev)
                        nodes.append(prev)
                t.option_end[-1].append(prev)
            t.nodes.append(nodes)
        return t

    def _add(self, tok: int, pos: int, parent: int, shareable: bool = False) -> int:
        self.ids.append(tok)
        self.positions.append(pos)
        self.parent.append(parent)
        self.group.append(self._group)
        if shareable:
            self._children[(parent if parent >= 0 else -1 - self._group, tok)] = len(self.ids) - 1
        return len(self.ids) - 1

    def _read(self, index: int) -> int:
        """The logits row for sequence index `index` (a question's last prompt token is read once for
        all its answers' first tokens)."""
        if index not in self._slot:
            self._slot[index] = len(self.read_from)
            self.read_from.append(index)
        return self._slot[index]

    def subtree(self, chunk: Sequence[Branches], questions: Sequence[int], n_state: int) -> tuple[Tree, torch.Tensor]:
        """The tree of some of this tree's questions (`chunk` is what this tree was built from), and for
        each of its nodes the node of this tree it is (to carry hidden states over)."""
        sub = Tree.build([chunk[q] for q in questions], n_state)
        rows = torch.empty(len(sub.ids), dtype=torch.long)
        for s, q in enumerate(questions):
            rows[torch.tensor(sub.nodes[s])] = torch.tensor(self.nodes[q])
        return sub, rows

    def features(self, scores: list[list[float]], hidden: torch.Tensor) -> list[Features]:
        # copies, not views: a view would keep the whole chunk's hidden states alive (and saved, when cached)
        return [
            Features(s, hidden[self.decision[q]].clone(), hidden[self.option_end[q]].clone())
            for q, s in enumerate(scores)
        ]

    def answer_logliks(self, logits: torch.Tensor) -> torch.Tensor:
        """`sum_logprobs` with gradients, as a (questions, most answers) tensor, for training."""
        read, tok, qs, ans = (torch.tensor(c) for c in zip(*self.targets))
        per_token = torch.log_softmax(logits.float(), dim=-1)[read, tok]
        return torch.zeros(len(self.n_answers), max(self.n_answers)).index_put((qs, ans), per_token, accumulate=True)

    def mask(self, n_state: int, dtype: torch.dtype, with_state: bool = False, spans=None) -> torch.Tensor:
        """The additive attention mask of a pass over this tree, (1, 1, rows, n_state + n_tokens): every tree
        token sees the state (with `spans`, group g only the state columns spans[g]) and its own ancestors.
        `with_state`: the pass runs the state's tokens too, first, causal among themselves (LoRA training's
        `forward_from`)."""
        n = len(self.ids)
        allowed = torch.zeros(n + (n_state if with_state else 0), n_state + n, dtype=torch.bool)
        if with_state:
            allowed[:n_state, :n_state] = torch.ones(n_state, n_state, dtype=torch.bool).tril()
        tree = allowed[len(allowed) - n :]  # the tree's rows (a view)
        if spans is None:
            tree[:, :n_state] = True
        else:
            group = torch.tensor(self.group)
            for g, (start, stop) in enumerate(spans):
                tree[group == g, start:stop] = True
        tree[:, n_state:] = self.visibility()  # ancestors and self
        return torch.zeros((1, 1, *allowed.shape), dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)

    def visibility(self) -> torch.Tensor:
        """Token i sees token j iff j is i or one of its ancestors (parents come before children)."""
        n = len(self.ids)
        seen = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parent):
            if p >= 0:
                seen[i] = seen[p]
            seen[i, i] = True
        return seen

    def sum_logprobs(
        self, logits: torch.Tensor, exact: Callable | None = None, rows: int = 16, top_k: int = 16
    ) -> list[list[float]]:
        """Each answer's log-likelihood: the sum of its tokens' log-probabilities. The normaliser is taken
        `rows` logits rows at a time, so no vocabulary-sized copy of all rows is made (a block stays a few
        MB: larger temporaries are fresh pages from the OS on every call, which cost more than the
        arithmetic). `exact(rows, tokens)`: the answer tokens' logits at higher precision than `logits`
        (CausalLMBackend._exact_logits); a log-probability is then capped at 0."""
        read, tok, qs, ans = (torch.tensor(c) for c in zip(*self.targets))
        per_token = torch.empty(len(read), dtype=torch.float64)
        for start in range(0, logits.shape[0], rows):
            block = logits[start : start + rows].float()
            if exact is not None:  # the largest logits, which make the normaliser, recomputed exactly
                top = block.topk(min(top_k, block.shape[1]), dim=-1).indices
                block.scatter_(1, top, exact(torch.arange(start, start + len(block), device=block.device), top))
            normaliser = torch.logsumexp(block, dim=-1)
            sel = ((read >= start) & (read < start + rows)).nonzero().squeeze(1)
            r = (read[sel] - start).to(block.device)
            t = tok[sel].to(block.device)
            target = block[r, t] if exact is None else exact(r + start, t[:, None])[:, 0]
            per_token[sel] = (target - normaliser[r]).clamp(max=0).double().cpu()
        totals = torch.zeros(len(self.n_answers), max(self.n_answers), dtype=torch.float64)
        totals.index_put_((qs, ans), per_token, accumulate=True)
        return [totals[q, :n].tolist() for q, n in enumerate(self.n_answers)]


def chunks(items: Sequence, budget: int, size: Callable = lambda q: q.n_tokens) -> Iterator[list]:
    """Greedy groups of whole items (questions, by default) of at most `budget` tokens (a larger item
    goes alone), so memory stays bounded however many questions share the state."""
    chunk: list = []
    total = 0
    for item in items:
        if chunk and total + size(item) > budget:
            yield chunk
            chunk, total = [], 0
        chunk.append(item)
        total += size(item)
    if chunk:
        yield chunk
