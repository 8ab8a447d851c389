"""The decoder's hidden states, for what reads more than answer log-likelihoods: trained heads (`features`),
early exit (`features_early_exit`: the questions a shallow head is sure of stop at an early layer, the rest
resume from there), and the LoRA training pass (`layer_inputs`, `forward_from`). A part of CausalLMBackend
(backends/causal_lm.py), kept apart so that the scoring path reads on its own; it runs through the backend's
tree pass (`_tree_pass`, `_run_state`), so every hidden state comes from the same packed, isolated pass as
the answers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..render import Branches
from .base import ReadoutUnsupported
from .tree import Features, Tree, chunks


@dataclass
class TreeInputs:
    """One chunk's inputs to decoder layer `layer` + 1: the state's hidden states after layer `layer`
    (n_state, hidden), the chunk's token tree and its hidden states (n_tokens, hidden)."""

    layer: int
    state: torch.Tensor
    tree: Tree
    hidden: torch.Tensor


class HiddenStates:
    """Hidden-state access for CausalLMBackend (see the module docstring)."""

    @torch.inference_mode()
    def features(self, state: Sequence[int], questions: Sequence[Branches], layers: Sequence[int]) -> list[Features]:
        """Hidden states for trained readouts, from the same packed pass as `score` (same mask, same
        isolation)."""
        cache = self._run_state(state)
        out: list[Features] = []
        for chunk in self._readout_chunks(state, questions):
            tree = Tree.build(chunk, len(state))
            scores, hidden = self._tree_pass(cache, len(state), tree, layers)
            out += tree.features(scores, hidden)
        return out

    @torch.inference_mode()
    def features_early_exit(
        self,
        state: Sequence[int],
        questions: Sequence[Branches],
        early: int,
        final: int,
        exits: Callable[[int, Features], bool],
    ) -> list[tuple[Features, Features | None]]:
        """Early exit: the questions run through decoder layers 1..`early` only; `exits(i, features)` says
        whether question i stops there; the others resume from their layer-`early` hidden states through
        the remaining layers (no layer runs twice), and get their layer-`final` features too. Exact: a
        question's tokens see only the state and themselves, so continuing a subset of the tree is the
        same computation as continuing all of it."""
        cache = self._run_state(state)
        n_state = len(state)
        out: list[tuple[Features, Features | None]] = []
        for chunk in self._readout_chunks(state, questions):
            tree = Tree.build(chunk, n_state)
            with self._layers(0, early):
                scores, hidden = self._tree_pass(cache, n_state, tree, [early])
            shallow = tree.features(scores, hidden)
            stay = [q for q, f in enumerate(shallow) if not exits(len(out) + q, f)]
            deep: dict[int, Features] = {}
            if stay:
                sub, rows = tree.subtree(chunk, stay, n_state)
                with self._layers(early, None):
                    scores, hidden_sub = self._tree_pass(cache, n_state, sub, [final], inputs_embeds=hidden[rows, 0])
                deep = dict(zip(stay, sub.features(scores, hidden_sub)))
            out += [(f, deep.get(q)) for q, f in enumerate(shallow)]
        return out

    # -- LoRA training (lora.py): the frozen layers 1..k run once per question; layers k+1..L run with grad
    @torch.no_grad()
    def layer_inputs(self, state: Sequence[int], questions: Sequence[Branches], layer: int) -> list[TreeInputs]:
        """The hidden states after decoder layer `layer` of the state and of each chunk's token tree (the
        served packed pass, through layers 1..`layer` only): what layers `layer`+1.. read, so a LoRA on
        those layers trains without re-running the frozen ones."""
        n_state = len(state)
        with self._outputs([layer]) as captured, self._layers(0, layer):
            cache = DynamicCache(config=self.model.config)
            self.model(
                input_ids=torch.tensor([list(state)], device=self.device), cache=cache, use_cache=True, logits_to_keep=1
            )
        state_hidden = captured[layer].float().cpu().clone()
        out = []
        for chunk in self._readout_chunks(state, questions):
            tree = Tree.build(chunk, n_state)
            with self._layers(0, layer):
                _, hidden = self._tree_pass(cache, n_state, tree, [layer])
            out.append(TreeInputs(layer, state_hidden, tree, hidden[:, 0].clone()))
        return out

    def forward_from(self, inputs: TreeInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layers k+1..L over the state and the tree together (no cache, so gradients reach the state's
        keys and values too), from `layer_inputs`' hidden states. Returns each question's answer
        log-likelihoods (Q, N_max; padding 0), its decision token's last-layer hidden state (Q, H) and its
        answers' end tokens' (Q, N_max, H): the same quantities the served pass gives, with gradients."""
        tree, n_state = inputs.tree, inputs.state.shape[0]
        mask = tree.mask(n_state, self.dtype, with_state=True)
        positions = list(range(n_state)) + tree.positions
        with self._outputs([self.depth]) as captured, self._layers(inputs.layer, None):
            out = self.model(
                inputs_embeds=torch.cat([inputs.state, inputs.hidden])[None].to(self.device, self.dtype),
                position_ids=torch.tensor([positions], device=self.device),
                attention_mask=mask.to(self.device),
                use_cache=False,
                logits_to_keep=torch.tensor(tree.read_from, device=self.device) + n_state,
            )
        hidden = captured[self.depth][n_state:].float()
        ends = torch.tensor([e + [e[0]] * (max(tree.n_answers) - len(e)) for e in tree.option_end])
        return tree.answer_logliks(out.logits[0]), hidden[tree.decision], hidden[ends]

    def _readout_chunks(self, state: Sequence[int], questions: Sequence[Branches]) -> Iterator[list[Branches]]:
        if self.packing == "rows" or self.sliding_window is not None:
            raise ReadoutUnsupported(
                "trained readouts need packed mode (a model that takes attention masks, without a sliding window)"
            )
        for chunk in chunks(questions, self.chunk_tokens):
            if len(chunk) == 1 and chunk[0].n_tokens > self.chunk_tokens:
                raise ReadoutUnsupported(
                    f"a question of {chunk[0].n_tokens} tokens is over the {self.chunk_tokens}-token "
                    "chunk a trained readout reads in one pass; shorten its options"
                )
            yield chunk

    @contextlib.contextmanager
    def _outputs(self, layers: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
        """While the block runs, the outputs of the given decoder layers (1-based), by layer, batch row 0."""
        captured: dict[int, torch.Tensor] = {}
        hooks = [
            self._all_layers[i - 1].register_forward_hook(
                lambda _m, _a, o, i=i: captured.__setitem__(i, (o[0] if isinstance(o, tuple) else o)[0])
            )
            for i in layers
        ]
        try:
            yield captured
        finally:
            for h in hooks:
                h.remove()

    @contextlib.contextmanager
    def _layers(self, start: int, stop: int | None):
        """Run decoder layers start+1..stop only (1-based; stop None = the last). HF decoders loop over
        `layers[:num_hidden_layers]`, and each attention layer keeps its own index into the cache, so a
        slice of the layer list is a pass over those layers."""
        decoder = self.model.get_decoder()
        full, count = decoder.layers, decoder.config.num_hidden_layers
        stop = count if stop is None else stop
        decoder.layers = torch.nn.ModuleList(list(full)[start:stop])
        decoder.config.num_hidden_layers = stop - start
        try:
            yield
        finally:
            decoder.layers, decoder.config.num_hidden_layers = full, count

    # -- the state, once
