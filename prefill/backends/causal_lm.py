"""Any Hugging Face causal LM as a prefill backend: one forward pass over a token tree, no decoding.

The state runs once and its keys/values are kept. Every question, and every answer under it, is then a
branch of a tree packed into one sequence and run over that cache with a 4D attention mask in which a
token sees the state and its own ancestors only, at position ids that continue from its parent as if
the branch were alone. So a question packed with a thousand others sees exactly what it would see alone
(up to float rounding: see tests/test_exactness.py), and answers cannot depend on batching or order.

An answer's score is the log-likelihood of its whole token sequence, end-of-answer marker included:
log P("fraud review<|im_end|>") is the probability that the model says exactly that and stops, so
options of any length, and options that share first tokens ("fraud" vs "fraud review"), are scored
exactly. Reading only the first token instead ties such options (both start with "fraud"), and it was also
worse where it does not tie; the chat template beat a plain prompt, so it is used whenever the tokenizer has
one (docs/measurements/real-text.md, `python -m benchmarks.quality.readout`).

Models whose layers ignore attention masks (recurrent or linear-attention hybrids), and sliding-window
models whose context outruns the window, are run as rows instead: each (question, answer) is a row
continuing from a copy of the cached state, which needs no mask beyond the causal one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import DynamicCache

from ..render import Branches, Renderer
from . import weights
from .base import Backend
from .cpu import exact_logits, head_input, isolated, pack_linears, states_run_alone
from .exact import split_attention
from .hidden import HiddenStates
from .rows import score_rows
from .states import StateCache, block_diagonal_mask, concat, cut
from .tree import Tree, chunks

# Layer kinds that take a custom attention mask. Anything else (linear attention, mamba, conv, ...) is
# a layer that would let packed branches see each other, so such models are run as rows.
MASKED_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}
RECURRENT_MODEL_TYPES = {"mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm"}


class CausalLMBackend(HiddenStates, Backend):
    """Scores answers as whole-sequence log-likelihoods, in packed chunks of at most `chunk_tokens`.

    chunk_tokens=2048: every query in a chunk attends to the whole chunk (masked entries cost compute too), so
    smaller chunks waste less attention; but each chunk is a pass that streams every weight once, which costs
    more on a larger model and once the matrix products are fast: 2048 beat 512 on the SemIf request in bf16
    and fp32, 1024 and 4096 were within a few percent (docs/measurements/cpu-precision.md, `python -m
    benchmarks.speed.fastpath --chunks`).

    The keys/values of recent states are kept (up to `state_cache_tokens` tokens in all, least recently used
    out first), so further requests about the same state skip re-reading it; the results are identical.
    """

    answers_by = "causal LM, one prefill pass"
    batches = reads_features = exits_early = merges_adapters = generates = True

    def __init__(
        self,
        model,
        tokenizer,
        name: str,
        *,
        packing: str = "auto",
        chunk_tokens: int = 2048,
        state_cache_tokens: int = 16384,
        state_pack_tokens: int = 2048,
        **prompt,
    ):
        """`prompt`: the Renderer's options (chat, system, noul_words, score_words, choice_words; render.py)."""
        self.model = model.eval()
        self.name = name
        self.renderer = Renderer(tokenizer, **prompt)
        self.chunk_tokens = chunk_tokens
        cfg = model.config.get_text_config(decoder=True)
        self.max_context = int(getattr(cfg, "max_position_embeddings", None) or 4096)
        self.sliding_window = getattr(cfg, "sliding_window", None) if _has_sliding_layers(cfg) else None
        if packing not in ("auto", "packed", "rows"):
            raise ValueError(f"packing must be auto, packed or rows, not {packing!r}")
        self.packing = packing if packing != "auto" else ("packed" if _takes_masks(cfg) else "rows")
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.forward_calls = 0  # forward passes run: the state, then one per chunk
        self.tokens_run = 0  # tokens those passes ran (shared prompt prefixes and cached states count once)
        self.adapter: Path | None = None  # a LoRA merged into the weights (merge_adapter)
        self.states = StateCache(state_cache_tokens)
        self.state_pack_tokens = state_pack_tokens  # score_many: states run side by side, up to this many tokens
        self.rows_read = 0  # positions whose next-token distribution was read (the LM head's rows)
        passes = ("state pass", "tree pass", "state and tree pass", "answer log-probabilities")
        self.seconds = dict.fromkeys(passes, 0.0)  # where time goes
        self._all_layers = list(model.get_decoder().layers)
        # bf16 on a CPU with bf16 units (backends/cpu.py), one copy of each weight (backends/weights.py)
        self.packed_linears = pack_linears(self.model, release=weights.releaser(self.model))
        weights.release(self.model)  # int8 layers' plain weights, which packing does not touch
        self.released_bytes = weights.released_bytes(self.model)
        if self.released_bytes:
            weights.own_memory(self.model)  # what is left, off the file's mapping
        self.weight_bytes = weights.served_bytes(self.model)

    @property
    def state_hits(self) -> int:  # states found in the cache
        return self.states.hits

    @property
    def state_misses(self) -> int:  # states that had to be run
        return self.states.misses

    def forget_states(self) -> None:
        self.states.clear()

    @property
    def depth(self) -> int:
        """The number of decoder layers."""
        return len(self._all_layers)

    # -- the interface
    @torch.inference_mode()
    def score(self, state: Sequence[int], questions: Sequence[Branches]) -> list[list[float]]:
        rows = self.packing == "rows" or (
            self.sliding_window is not None and len(state) + max(_longest(q) for q in questions) > self.sliding_window
        )
        groups = list(chunks(questions, self.chunk_tokens))
        scores: list[list[float]] = []
        if not rows and self._runs_state_first(state, groups[0]):
            scores, cache = self._state_then_tree(state, Tree.build(groups[0], len(state)))
            groups = groups[1:]
        else:
            cache = self._run_state(state)
        for chunk in groups:
            if rows:
                scores += score_rows(self, cache, len(state), chunk)
            elif len(chunk) == 1 and chunk[0].n_tokens > self.chunk_tokens:
                scores.append(self._score_large(cache, len(state), chunk[0]))
            else:
                scores += self._score_packed(cache, len(state), chunk)
        return scores

    @torch.inference_mode()
    def score_many(self, jobs: Sequence[tuple[Sequence[int], Sequence[Branches]]]) -> list[list[list[float]]]:
        """`score` for several requests at once, in shared passes: the states not cached yet run side by side
        in one pass (each sees only itself), then every request's questions are packed into the same
        chunks, each question's tokens seeing only its own state and its own ancestors. So an answer is the
        one `score` gives alone, up to float rounding (tests/test_exactness.py), and a forward's fixed cost is
        paid once per chunk instead of once per request. Row and sliding-window models, and questions too
        large for a chunk, are scored per request."""
        if len(jobs) == 1 or self.packing == "rows" or self.sliding_window is not None:
            return [self.score(state, questions) for state, questions in jobs]
        caches = self._run_states([state for state, _ in jobs])
        out: list[list[list[float] | None]] = [[None] * len(questions) for _, questions in jobs]
        small = []
        for j, (state, questions) in enumerate(jobs):
            for i, q in enumerate(questions):
                if q.n_tokens > self.chunk_tokens:
                    out[j][i] = self._score_large(caches[j], len(state), q)
                else:
                    small.append((j, i, q))
        for chunk in chunks(small, self.chunk_tokens, size=lambda item: item[2].n_tokens):
            groups: dict[int, int] = {}  # a state (by its cache) -> its group in this chunk
            for j, _, _ in chunk:
                groups.setdefault(id(caches[j]), len(groups))
            firsts = {id(caches[j]): j for j, _, _ in reversed(chunk)}
            members = [firsts[key] for key in groups]  # one request per group, for its state
            spans, start = [], 0
            for j in members:
                spans.append((start, start + len(jobs[j][0])))
                start += len(jobs[j][0])
            tree = Tree.build(
                [q for _, _, q in chunk],
                [len(jobs[j][0]) for j, _, _ in chunk],
                [groups[id(caches[j])] for j, _, _ in chunk],
            )
            cache = caches[members[0]] if len(members) == 1 else concat([caches[j] for j in members])
            scores, _ = self._tree_pass(cache, start, tree, spans=spans if len(members) > 1 else None)
            for (j, i, _), s in zip(chunk, scores):
                out[j][i] = s
        return out

    def merge_adapter(self, path) -> None:
        """Merge a LoRA adapter (peft's format, saved by `prefill train --kind lora`) into the weights: the
        served pass is then the same computation as before, over updated weights. Once per backend: merging
        the same adapter again does nothing, and another one is refused (the weights are no longer the base's)."""
        if self.adapter is not None:
            if Path(path) != self.adapter:
                raise ValueError(f"this model already has the adapter {self.adapter} merged into its weights")
            return
        from peft import PeftModel

        weights.restore(self.model)  # the plain weights, to merge into (they stay: the files no longer hold them)
        self.model = PeftModel.from_pretrained(self.model, str(path)).merge_and_unload().eval()
        self.adapter = Path(path)
        self._all_layers = list(self.model.get_decoder().layers)
        self.packed_linears = pack_linears(self.model)
        self.states.clear()

    def _runs_state_first(self, state: Sequence[int], chunk: Sequence[Branches]) -> bool:
        """Whether a request's state and its first chunk of questions run in one pass: when the state is not
        cached, the chunk is packed, and attention is the split one (exact bf16, int8: backends/exact.py). One pass
        streams every weight once where two would twice: the 1.5B's SemIf request, state and questions, 1.57 s
        in one pass against 1.81 s in two, its one-question request 0.88 against 1.03 s
        (docs/measurements/cpu-precision.md#exact-by-default). There the state's keys and values are the bits of
        its own pass (backends/exact.py), so it is cached as if run alone, and a later request about the same
        state gets the same answers. Elsewhere (fp32, plain bf16) one pass would round them otherwise than two,
        and a cached state's answers would move in the last bits: those keep the two passes."""
        if not split_attention(self.model) or len(chunk) == 1 and chunk[0].n_tokens > self.chunk_tokens:
            return False
        if tuple(state) in self.states:
            return False
        return len(state) + sum(q.n_tokens for q in chunk) <= self.chunk_tokens + self.state_pack_tokens

    def _state_then_tree(self, state: Sequence[int], tree: Tree) -> tuple[list[list[float]], DynamicCache]:
        """The state's tokens, then the tree's, in one pass: the answers, and the state's keys and values
        (cached)."""
        _, missing = self.states.lookup([state])  # counted as a miss, as `_run_state` would
        n_state, cache = len(state), DynamicCache(config=self.model.config)
        mask = tree.mask(n_state, self.dtype, with_state=True)
        started = time.perf_counter()
        with head_input(self.model, self.dtype) as head, isolated(self.model, tree, n_state, prefix=n_state):
            out = self.model(
                input_ids=torch.tensor([[*state, *tree.ids]], device=self.device),
                position_ids=torch.tensor([[*range(n_state), *tree.positions]], device=self.device),
                attention_mask=mask.to(self.device),
                cache=cache,
                use_cache=True,
                logits_to_keep=torch.tensor([n_state + i for i in tree.read_from], device=self.device),
            )
        self.forward_calls += 1
        self.tokens_run += n_state + len(tree.ids)
        self.rows_read += len(tree.read_from)
        read = time.perf_counter()
        scores = tree.sum_logprobs(out.logits[0], exact_logits(self.model, head))
        self.seconds["state and tree pass"] += read - started
        self.seconds["answer log-probabilities"] += time.perf_counter() - read
        own = cut(cache, [n_state, len(tree.ids)])[0]
        self.states.keep({tuple(state): own})
        return scores, own

    def _run_state(self, state: Sequence[int]) -> DynamicCache:
        return self._run_states([state])[0]

    def _run_states(self, states: Sequence[Sequence[int]]) -> list[DynamicCache]:
        """Each state's keys/values: from the cache, else computed. States not cached yet are run side by
        side in one pass (up to `state_pack_tokens` tokens; each one at its own positions, seeing only
        itself), then cut apart: the same keys and values, up to float rounding, as run alone (in int8, and
        bf16 with --exact, where that rounding would move answers, each runs alone: cpu.states_run_alone)."""
        found, missing = self.states.lookup(states)
        computed: dict[tuple[int, ...], DynamicCache] = {}
        budget = 0 if states_run_alone(self.model) else self.state_pack_tokens
        for group in chunks(missing, budget, size=len):
            computed.update(zip(group, self._state_pass(group)))
        self.states.keep(computed)
        found.update(computed)
        return [found[tuple(s)] for s in states]

    def _state_pass(self, states: Sequence[tuple[int, ...]]) -> list[DynamicCache]:
        cache = DynamicCache(config=self.model.config)
        ids = torch.tensor([[t for s in states for t in s]], device=self.device)
        self.forward_calls += 1
        self.tokens_run += ids.shape[1]
        decoder = self.model.get_decoder()  # keys and values only: no LM head
        started = time.perf_counter()
        if len(states) == 1:
            with isolated(self.model, None, ids.shape[1], prefix=ids.shape[1]):
                decoder(input_ids=ids, cache=cache, use_cache=True)
        else:
            mask, positions = block_diagonal_mask([len(s) for s in states], self.dtype)
            decoder(
                input_ids=ids,
                position_ids=torch.tensor([positions], device=self.device),
                attention_mask=mask.to(self.device),
                cache=cache,
                use_cache=True,
            )
        self.seconds["state pass"] += time.perf_counter() - started
        return [cache] if len(states) == 1 else cut(cache, [len(s) for s in states])

    # -- packed: one sequence, a tree mask
    def _score_packed(self, cache: DynamicCache, n_state: int, chunk: Sequence[Branches]) -> list[list[float]]:
        return self._tree_pass(cache, n_state, Tree.build(chunk, n_state))[0]

    def _tree_pass(
        self,
        cache: DynamicCache,
        n_state: int,
        tree: Tree,
        layers: Sequence[int] = (),
        inputs_embeds: torch.Tensor | None = None,
        spans: Sequence[tuple[int, int]] | None = None,
    ) -> tuple[list[list[float]], torch.Tensor | None]:
        """One pass of the tree over the cached state: each question's answer log-likelihoods, and with
        `layers` the hidden states after those decoder layers (1-based), (n_tokens, n_layers, hidden).
        `inputs_embeds` starts the pass from given hidden states instead of the tokens' embeddings.
        `spans`: the cache holds several states side by side (score_many); a token of group g sees only
        the cache columns spans[g]."""
        n = len(tree.ids)
        mask = tree.mask(n_state, self.dtype, spans=spans)
        branch_cache = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in cache.layers])
        inputs = (
            {"inputs_embeds": inputs_embeds[None].to(self.device, self.dtype)}
            if inputs_embeds is not None
            else {"input_ids": torch.tensor([tree.ids], device=self.device)}
        )
        started = time.perf_counter()
        with (
            self._outputs(layers) as captured,
            head_input(self.model, self.dtype) as head,
            isolated(self.model, tree, n_state, spans),
        ):
            out = self.model(
                **inputs,
                position_ids=torch.tensor([tree.positions], device=self.device),
                attention_mask=mask.to(self.device),
                cache=branch_cache,
                use_cache=True,
                logits_to_keep=torch.tensor(tree.read_from, device=self.device),
            )
        self.forward_calls += 1
        self.tokens_run += n
        self.rows_read += len(tree.read_from)
        hidden = torch.stack([captured[i] for i in layers], dim=1).float().cpu() if layers else None
        read = time.perf_counter()
        scores = tree.sum_logprobs(out.logits[0], exact_logits(self.model, head))
        self.seconds["tree pass"] += read - started
        self.seconds["answer log-probabilities"] += time.perf_counter() - read
        return scores, hidden

    # -- a question too large for one chunk (say 255 long options): its prompt extends the cached state,
    #    then its answers run in chunks over that, so memory stays bounded by the chunk budget
    def _score_large(self, cache: DynamicCache, n_state: int, q: Branches) -> list[float]:
        extended = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in cache.layers])
        out = self.model(
            input_ids=torch.tensor([list(q.prompt)], device=self.device),
            position_ids=torch.arange(n_state, n_state + len(q.prompt), device=self.device)[None],
            cache=extended,
            use_cache=True,
            logits_to_keep=1,
        )
        self.forward_calls += 1
        self.tokens_run += len(q.prompt)
        first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        # Each answer's first token is read above; the rest of it is a branch whose root is that token.
        longer = [a for a in q.answers if len(a) > 1]
        tails: list[float] = []
        for chunk in chunks([Branches((a[0],), (a[1:],)) for a in longer], self.chunk_tokens):
            tails += [tail for (tail,) in self._score_packed(extended, n_state + len(q.prompt), chunk)]
        rest = dict(zip(longer, tails))
        return [float(first[a[0]]) + rest.get(a, 0.0) for a in q.answers]


def _longest(q: Branches) -> int:
    return len(q.prompt) + max(len(a) for a in q.answers)


def _layer_types(cfg) -> list[str]:
    return list(getattr(cfg, "layer_types", None) or [])


def _takes_masks(cfg) -> bool:
    if getattr(cfg, "model_type", "") in RECURRENT_MODEL_TYPES:
        return False
    return all(t in MASKED_LAYERS for t in _layer_types(cfg))


def _has_sliding_layers(cfg) -> bool:
    types = _layer_types(cfg)
    if types:
        return "sliding_attention" in types
    return bool(getattr(cfg, "sliding_window", None)) and getattr(cfg, "use_sliding_window", True)
