"""Any Hugging Face causal LM as a prefill backend: one forward pass over a token tree, no decoding.

The state runs once and its keys/values are kept. Every question, and every answer under it, is then a
branch of a tree packed into one sequence and run over that cache with a 4D attention mask in which a
token sees the state and its own ancestors only, at position ids that continue from its parent as if
the branch were alone. So a question packed with a thousand others sees exactly what it would see alone
(up to float rounding: see tests/test_exactness.py), and answers cannot depend on batching or order.

An answer's score is the log-likelihood of its whole token sequence, end-of-answer marker included:
log P("fraud review<|im_end|>") is the probability that the model says exactly that and stops, so
options of any length, and options that share first tokens ("fraud" vs "fraud review"), are scored
exactly. Reading only the first token instead ties such options (both start with "fraud"), and it is also
worse where it does not tie. Measured with `python -m benchmarks.readout --per-family 20` (SmolLM2-135M,
sys1bench's five policy-labelled families, 400 questions): whole sequence vs first token, chat template,
accuracy 0.22 vs 0.15 on choice and 0.625 vs 0.445 on noul, log loss 2.94 vs 3.11 and 0.66 vs 0.75; score
accuracy is at chance either way (0.19 vs 0.18). The chat template beats a plain prompt on choice and noul
(noul accuracy 0.625 vs 0.35), so it is used whenever the tokenizer has one.

Models whose layers ignore attention masks (recurrent or linear-attention hybrids), and sliding-window
models whose context outruns the window, are run as rows instead: each (question, answer) is a row
continuing from a copy of the cached state, which needs no mask beyond the causal one.
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from ..render import DEFAULT_NOUL_WORDS, DEFAULT_SCORE_WORDS, DEFAULT_SYSTEM, Branches, Renderer
from .base import ReadoutUnsupported
from .cpu import pack_linears

# Layer kinds that take a custom attention mask. Anything else (linear attention, mamba, conv, ...) is
# a layer that would let packed branches see each other, so such models are run as rows.
MASKED_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}
RECURRENT_MODEL_TYPES = {"mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm"}


@dataclass
class Features:
    """What a trained readout reads for one question: hidden states after the given decoder layers at the
    decision token (the prompt's last token, where the answer starts) and at each answer's end token (its
    last token before the end-of-answer marker), and the answers' log-likelihoods (from the last layer the
    pass ran; meaningful only for a full-depth pass)."""
    loglik: list[float]
    decision: torch.Tensor   # (n_layers, hidden)
    options: torch.Tensor    # (n_answers, n_layers, hidden)


@dataclass
class TreeInputs:
    """One chunk's inputs to decoder layer `layer` + 1: the state's hidden states after layer `layer`
    (n_state, hidden), the chunk's token tree and its hidden states (n_tokens, hidden)."""
    layer: int
    state: torch.Tensor
    tree: _Tree
    hidden: torch.Tensor


class CausalLMBackend:
    """Scores answers as whole-sequence log-likelihoods, in packed chunks of at most `chunk_tokens`.

    chunk_tokens=2048: every query in a chunk attends to the whole chunk (masked entries cost compute too), so
    smaller chunks waste less attention; but each chunk is a pass that streams every weight once, which costs
    more on a larger model and once the matrix products are fast. `python -m benchmarks.fastpath --chunks`
    (Qwen2.5-Coder-0.5B, the SemIf state, 1 / 21 / 100 questions, fresh state, 2 cores): bf16 512 → 0.29 /
    0.58 / 1.93 s, 2048 → 0.31 / 0.51 / 1.75 s; fp32 512 → 1.11 / 2.30 / 7.48 s, 2048 → 1.10 / 2.04 / 6.18 s
    (1024 and 4096 within a few percent of 2048). (On SmolLM2-135M in fp32, 512 had been best: 100 questions
    6.1 s vs 7.3 s at 2048.)

    The keys/values of recent states are kept (up to `state_cache_tokens` tokens in all, least recently used
    out first), so further requests about the same state skip re-reading it; the results are identical.
    """

    def __init__(self, model, tokenizer, name: str, *, description: str = "", release_date: str = "",
                 chat: bool | None = None, system: bool = DEFAULT_SYSTEM, noul_words: str = DEFAULT_NOUL_WORDS,
                 score_words: str = DEFAULT_SCORE_WORDS, packing: str = "auto",
                 chunk_tokens: int = 2048, state_cache_tokens: int = 16384, state_pack_tokens: int = 2048,
                 fingerprint: str = ""):
        self.model = model.eval()
        self.name = name
        self.fingerprint = fingerprint
        self.description = description or f"{name} (causal LM, one prefill pass)"
        self.release_date = release_date
        self.renderer = Renderer(tokenizer, chat=chat, system=system, noul_words=noul_words, score_words=score_words)
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
        self.tokens_run = 0     # tokens those passes ran (shared prompt prefixes and cached states count once)
        self.adapter: Path | None = None  # a LoRA merged into the weights (merge_adapter)
        self.state_cache_tokens = state_cache_tokens
        self.state_pack_tokens = state_pack_tokens  # score_many: states run side by side, up to this many tokens
        self.rows_read = 0      # positions whose next-token distribution was read (the LM head's rows)
        self.seconds = {"state pass": 0.0, "tree pass": 0.0, "answer log-probabilities": 0.0}  # where time goes
        self.state_hits = 0     # states found in the cache
        self.state_misses = 0   # states that had to be run
        self._states: OrderedDict[tuple[int, ...], DynamicCache] = OrderedDict()
        self._all_layers = list(model.get_decoder().layers)
        self.packed_linears = pack_linears(self.model)  # bf16 on a CPU with bf16 units: see backends/cpu.py

    @property
    def depth(self) -> int:
        """The number of decoder layers."""
        return len(self._all_layers)

    # -- the interface
    @torch.inference_mode()
    def score(self, state: Sequence[int], questions: Sequence[Branches]) -> list[list[float]]:
        cache = self._run_state(state)
        rows = self.packing == "rows" or (
            self.sliding_window is not None and len(state) + max(_longest(q) for q in questions) > self.sliding_window)
        scores: list[list[float]] = []
        for chunk in _chunks(questions, self.chunk_tokens):
            if rows:
                scores += self._score_rows(cache, len(state), chunk)
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
        for chunk in _chunks(small, self.chunk_tokens, size=lambda item: item[2].n_tokens):
            groups: dict[int, int] = {}   # a state (by its cache) -> its group in this chunk
            for j, _, _ in chunk:
                groups.setdefault(id(caches[j]), len(groups))
            firsts = {id(caches[j]): j for j, _, _ in reversed(chunk)}
            members = [firsts[key] for key in groups]                # one request per group, for its state
            spans, start = [], 0
            for j in members:
                spans.append((start, start + len(jobs[j][0])))
                start += len(jobs[j][0])
            tree = _Tree.build([q for _, _, q in chunk], [len(jobs[j][0]) for j, _, _ in chunk],
                               [groups[id(caches[j])] for j, _, _ in chunk])
            cache = caches[members[0]] if len(members) == 1 else _concat([caches[j] for j in members])
            scores, _ = self._tree_pass(cache, start, tree, spans=spans if len(members) > 1 else None)
            for (j, i, _), s in zip(chunk, scores):
                out[j][i] = s
        return out

    @torch.inference_mode()
    def features(self, state: Sequence[int], questions: Sequence[Branches], layers: Sequence[int]) -> list[Features]:
        """Hidden states for trained readouts, from the same packed pass as `score` (same mask, same
        isolation)."""
        cache = self._run_state(state)
        out: list[Features] = []
        for chunk in self._readout_chunks(state, questions):
            tree = _Tree.build(chunk, len(state))
            scores, hidden = self._tree_pass(cache, len(state), tree, layers)
            out += tree.features(scores, hidden)
        return out

    @torch.inference_mode()
    def features_early_exit(self, state: Sequence[int], questions: Sequence[Branches], early: int, final: int,
                            exits: Callable[[int, Features], bool]) -> list[tuple[Features, Features | None]]:
        """Early exit: the questions run through decoder layers 1..`early` only; `exits(i, features)` says
        whether question i stops there; the others resume from their layer-`early` hidden states through
        the remaining layers (no layer runs twice), and get their layer-`final` features too. Exact: a
        question's tokens see only the state and themselves, so continuing a subset of the tree is the
        same computation as continuing all of it."""
        cache = self._run_state(state)
        n_state = len(state)
        out: list[tuple[Features, Features | None]] = []
        for chunk in self._readout_chunks(state, questions):
            tree = _Tree.build(chunk, n_state)
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
            self.model(input_ids=torch.tensor([list(state)], device=self.device), cache=cache, use_cache=True,
                       logits_to_keep=1)
        state_hidden = captured[layer].float().cpu().clone()
        out = []
        for chunk in self._readout_chunks(state, questions):
            tree = _Tree.build(chunk, n_state)
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
        n = n_state + len(tree.ids)
        allowed = torch.zeros(n, n, dtype=torch.bool)
        allowed[:n_state, :n_state] = torch.ones(n_state, n_state, dtype=torch.bool).tril()
        allowed[n_state:, :n_state] = True
        allowed[n_state:, n_state:] = tree.visibility()
        mask = torch.zeros((1, 1, n, n), dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        positions = list(range(n_state)) + tree.positions
        with self._outputs([self.depth]) as captured, self._layers(inputs.layer, None):
            out = self.model(inputs_embeds=torch.cat([inputs.state, inputs.hidden])[None].to(self.device, self.dtype),
                             position_ids=torch.tensor([positions], device=self.device),
                             attention_mask=mask.to(self.device), use_cache=False,
                             logits_to_keep=torch.tensor(tree.read_from, device=self.device) + n_state)
        hidden = captured[self.depth][n_state:].float()
        ends = torch.tensor([e + [e[0]] * (max(tree.n_answers) - len(e)) for e in tree.option_end])
        return tree.answer_logliks(out.logits[0]), hidden[tree.decision], hidden[ends]

    def merge_adapter(self, path) -> None:
        """Merge a LoRA adapter (peft's format, saved by `prefill train --kind lora`) into the weights: the
        served pass is then the same computation as before, over updated weights. Once per backend: merging
        the same adapter again does nothing, and another one is refused (the weights are no longer the base's)."""
        if self.adapter is not None:
            if Path(path) != self.adapter:
                raise ValueError(f"this model already has the adapter {self.adapter} merged into its weights")
            return
        from peft import PeftModel
        self.model = PeftModel.from_pretrained(self.model, str(path)).merge_and_unload().eval()
        self.adapter = Path(path)
        self._all_layers = list(self.model.get_decoder().layers)
        self.packed_linears = pack_linears(self.model)
        self._states.clear()

    def _readout_chunks(self, state: Sequence[int], questions: Sequence[Branches]) -> Iterator[list[Branches]]:
        if self.packing == "rows" or self.sliding_window is not None:
            raise ReadoutUnsupported("trained readouts need packed mode (a model that takes attention masks, "
                                     "without a sliding window)")
        for chunk in _chunks(questions, self.chunk_tokens):
            if len(chunk) == 1 and chunk[0].n_tokens > self.chunk_tokens:
                raise ReadoutUnsupported(f"a question of {chunk[0].n_tokens} tokens is over the {self.chunk_tokens}-token "
                                         "chunk a trained readout reads in one pass; shorten its options")
            yield chunk

    @contextlib.contextmanager
    def _outputs(self, layers: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
        """While the block runs, the outputs of the given decoder layers (1-based), by layer, batch row 0."""
        captured: dict[int, torch.Tensor] = {}
        hooks = [self._all_layers[i - 1].register_forward_hook(
            lambda _m, _a, o, i=i: captured.__setitem__(i, (o[0] if isinstance(o, tuple) else o)[0]))
            for i in layers]
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
    def _run_state(self, state: Sequence[int]) -> DynamicCache:
        return self._run_states([state])[0]

    def _run_states(self, states: Sequence[Sequence[int]]) -> list[DynamicCache]:
        """Each state's keys/values: from the cache, else computed. States not cached yet are run side by
        side in one pass (up to `state_pack_tokens` tokens; each one at its own positions, seeing only
        itself), then cut apart: the same keys and values, up to float rounding, as run alone."""
        found: dict[tuple[int, ...], DynamicCache] = {}
        missing: list[tuple[int, ...]] = []
        for key in map(tuple, states):
            if key in found or key in missing:
                continue
            if key in self._states:
                self._states.move_to_end(key)
                found[key] = self._states[key]
                self.state_hits += 1
            else:
                missing.append(key)
                self.state_misses += 1
        for group in _chunks(missing, self.state_pack_tokens, size=len):
            found.update(zip(group, self._state_pass(group)))
        for key in missing:
            if len(key) <= self.state_cache_tokens:
                self._states[key] = found[key]
        while sum(len(k) for k in self._states) > self.state_cache_tokens:
            self._states.popitem(last=False)
        return [found[tuple(s)] for s in states]

    def _state_pass(self, states: Sequence[tuple[int, ...]]) -> list[DynamicCache]:
        cache = DynamicCache(config=self.model.config)
        ids = torch.tensor([[t for s in states for t in s]], device=self.device)
        self.forward_calls += 1
        self.tokens_run += ids.shape[1]
        decoder = self.model.get_decoder()  # keys and values only: no LM head
        started = time.perf_counter()
        if len(states) == 1:
            decoder(input_ids=ids, cache=cache, use_cache=True)
            self.seconds["state pass"] += time.perf_counter() - started
            return [cache]
        n = ids.shape[1]
        allowed = torch.zeros(n, n, dtype=torch.bool)
        positions, start = [], 0
        for s in states:  # block-diagonal: causal within each state, nothing across
            allowed[start:start + len(s), start:start + len(s)] = torch.ones(len(s), len(s), dtype=torch.bool).tril()
            positions += range(len(s))
            start += len(s)
        mask = torch.zeros((1, 1, n, n), dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        decoder(input_ids=ids, position_ids=torch.tensor([positions], device=self.device),
                attention_mask=mask.to(self.device), cache=cache, use_cache=True)
        self.seconds["state pass"] += time.perf_counter() - started
        out, start = [], 0
        for s in states:
            out.append(DynamicCache(ddp_cache_data=[(layer.keys[:, :, start:start + len(s)].clone(),
                                                     layer.values[:, :, start:start + len(s)].clone())
                                                    for layer in cache.layers]))
            start += len(s)
        return out

    # -- packed: one sequence, a tree mask
    def _score_packed(self, cache: DynamicCache, n_state: int, chunk: Sequence[Branches]) -> list[list[float]]:
        return self._tree_pass(cache, n_state, _Tree.build(chunk, n_state))[0]

    def _tree_pass(self, cache: DynamicCache, n_state: int, tree: _Tree, layers: Sequence[int] = (),
                   inputs_embeds: torch.Tensor | None = None, spans: Sequence[tuple[int, int]] | None = None,
                   ) -> tuple[list[list[float]], torch.Tensor | None]:
        """One pass of the tree over the cached state: each question's answer log-likelihoods, and with
        `layers` the hidden states after those decoder layers (1-based), (n_tokens, n_layers, hidden).
        `inputs_embeds` starts the pass from given hidden states instead of the tokens' embeddings.
        `spans`: the cache holds several states side by side (score_many); a token of group g sees only
        the cache columns spans[g]."""
        n = len(tree.ids)
        allowed = torch.ones(n, n_state + n, dtype=torch.bool)       # the state is visible to all
        if spans is not None:
            allowed[:, :n_state] = False
            group = torch.tensor(tree.group)
            for g, (start, stop) in enumerate(spans):
                allowed[group == g, start:stop] = True
        allowed[:, n_state:] = tree.visibility()                     # ancestors and self
        mask = torch.zeros((1, 1, n, n_state + n), dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        branch_cache = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in cache.layers])
        inputs = ({"inputs_embeds": inputs_embeds[None].to(self.device, self.dtype)} if inputs_embeds is not None
                  else {"input_ids": torch.tensor([tree.ids], device=self.device)})
        started = time.perf_counter()
        with self._outputs(layers) as captured, self._head_input() as head:
            out = self.model(**inputs, position_ids=torch.tensor([tree.positions], device=self.device),
                             attention_mask=mask.to(self.device), cache=branch_cache, use_cache=True,
                             logits_to_keep=torch.tensor(tree.read_from, device=self.device))
        self.forward_calls += 1
        self.tokens_run += n
        self.rows_read += len(tree.read_from)
        hidden = torch.stack([captured[i] for i in layers], dim=1).float().cpu() if layers else None
        read = time.perf_counter()
        scores = tree.sum_logprobs(out.logits[0], self._exact_logits(head))
        self.seconds["tree pass"] += read - started
        self.seconds["answer log-probabilities"] += time.perf_counter() - read
        return scores, hidden

    @contextlib.contextmanager
    def _head_input(self) -> Iterator[list[torch.Tensor]]:
        """While the block runs, what the LM head reads (the final hidden states of the rows it scores).
        Only under reduced precision with a plain linear head (see `_exact_logits`)."""
        captured: list[torch.Tensor] = []
        head = self.model.get_output_embeddings()
        if self.dtype == torch.float32 or type(head) is not torch.nn.Linear or _scales_logits(self.model.config):
            yield captured
            return
        hook = head.register_forward_pre_hook(lambda _m, args: captured.append(args[0][0]))
        try:
            yield captured
        finally:
            hook.remove()

    def _exact_logits(self, head_input: list[torch.Tensor]) -> Callable | None:
        """In bf16 the head's logits are rounded to 8 significant bits (a logit of 20 to within 0.06), as much
        error as the whole bf16 body adds to an answer. So `sum_logprobs` recomputes in fp32, from the head's
        input, the logits of the answer tokens and the row's largest ones (which make its normaliser); the
        rest of the vocabulary stays bf16. An fp32 head would cost 4-5x the bf16 one here (98 vs 22 ms for
        60 rows of Qwen2.5-0.5B's 151,936-token head: `python -m benchmarks.fastpath --micro`); this costs a
        top-k and a few dot products. `python -m benchmarks.fastpath --precision` (Qwen2.5-Coder-0.5B, 92
        answer distributions, against fp32): mean |dp| 0.0156 with the bf16 logits as they are, 0.0064 with
        this (ad hoc, on 69 of them: an fp32 head gave the same as this to 1e-6). Returns exact(rows (n,),
        tokens (n, k)) -> (n, k) fp32 logits, or None."""
        if not head_input:
            return None
        hidden = head_input[0]
        head = self.model.get_output_embeddings()

        def exact(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            """rows (n,), tokens (n, k) -> their logits (n, k) in fp32."""
            out = torch.einsum("nh,nkh->nk", hidden[rows].float(), head.weight[tokens].float())
            return out + head.bias[tokens].float() if head.bias is not None else out
        return exact

    # -- a question too large for one chunk (say 255 long options): its prompt extends the cached state,
    #    then its answers run in chunks over that, so memory stays bounded by the chunk budget
    def _score_large(self, cache: DynamicCache, n_state: int, q: Branches) -> list[float]:
        extended = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in cache.layers])
        out = self.model(input_ids=torch.tensor([list(q.prompt)], device=self.device),
                         position_ids=torch.arange(n_state, n_state + len(q.prompt), device=self.device)[None],
                         cache=extended, use_cache=True, logits_to_keep=1)
        self.forward_calls += 1
        self.tokens_run += len(q.prompt)
        first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        # Each answer's first token is read above; the rest of it is a branch whose root is that token.
        longer = [a for a in q.answers if len(a) > 1]
        tails: list[float] = []
        for chunk in _chunks([Branches((a[0],), (a[1:],)) for a in longer], self.chunk_tokens):
            tails += [tail for (tail,) in self._score_packed(extended, n_state + len(q.prompt), chunk)]
        rest = dict(zip(longer, tails))
        return [float(first[a[0]]) + rest.get(a, 0.0) for a in q.answers]

    # -- rows: each (question, answer) continues from its own copy of the state
    def _score_rows(self, cache: DynamicCache, n_state: int, chunk: Sequence[Branches]) -> list[list[float]]:
        rows = [list(q.prompt) + list(a[:-1]) for q in chunk for a in q.answers]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=self.device)  # right padding
        row_cache = copy.deepcopy(cache)
        row_cache.batch_repeat_interleave(len(rows))
        positions = torch.arange(n_state, n_state + width, device=self.device).expand(len(rows), -1)
        logits = self.model(input_ids=ids, position_ids=positions, cache=row_cache, use_cache=True).logits
        self.forward_calls += 1
        self.tokens_run += ids.numel()
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        scores, r = [], 0
        for q in chunk:
            per_answer = []
            for a in q.answers:
                start = len(q.prompt) - 1  # the last prompt token predicts the answer's first token
                steps = torch.arange(start, start + len(a), device=self.device)
                per_answer.append(float(logprobs[r, steps, torch.tensor(a, device=self.device)].sum()))
                r += 1
            scores.append(per_answer)
        return scores


class _Tree:
    """A chunk of questions laid out as one sequence. Question prompts form a trie: prompts that begin
    with the same tokens share those tokens' nodes (same tokens, same positions, same ancestors: the
    same computation, done once), so "\n\nQuestion: Does the customer ..." is read once for every
    question that starts so. Under each prompt, each answer's tokens but the last (the last one is only
    predicted, never read from). A token sees exactly its ancestors."""

    def __init__(self):
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.parent: list[int] = []     # the node this one continues (-1: the state)
        self.read_from: list[int] = []  # sequence indices whose logits are read (deduplicated)
        self.targets: list[tuple[int, int, int, int]] = []  # (read index, token, question, answer)
        self.n_answers: list[int] = []
        self.decision: list[int] = []           # per question: its prompt's last token
        self.option_end: list[list[int]] = []   # per question, per answer: its last token before the marker
        self.nodes: list[list[int]] = []        # per question: its nodes, prompt then answers, in order
        self.group: list[int] = []      # which state the node continues (several only in score_many)
        self._group = 0
        self._slot: dict[int, int] = {}
        self._children: dict[tuple[int, int], int] = {}  # (parent, token) -> prompt node; roots: -1 - group

    @classmethod
    def build(cls, chunk: Sequence[Branches], n_state: int | Sequence[int], groups: Sequence[int] | None = None) -> _Tree:
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

    def subtree(self, chunk: Sequence[Branches], questions: Sequence[int], n_state: int) -> tuple[_Tree, torch.Tensor]:
        """The tree of some of this tree's questions (`chunk` is what this tree was built from), and for
        each of its nodes the node of this tree it is (to carry hidden states over)."""
        sub = _Tree.build([chunk[q] for q in questions], n_state)
        rows = torch.empty(len(sub.ids), dtype=torch.long)
        for s, q in enumerate(questions):
            rows[torch.tensor(sub.nodes[s])] = torch.tensor(self.nodes[q])
        return sub, rows

    def features(self, scores: list[list[float]], hidden: torch.Tensor) -> list[Features]:
        # copies, not views: a view would keep the whole chunk's hidden states alive (and saved, when cached)
        return [Features(s, hidden[self.decision[q]].clone(), hidden[self.option_end[q]].clone())
                for q, s in enumerate(scores)]

    def answer_logliks(self, logits: torch.Tensor) -> torch.Tensor:
        """`sum_logprobs` with gradients, as a (questions, most answers) tensor, for training."""
        read, tok, qs, ans = (torch.tensor(c) for c in zip(*self.targets))
        per_token = torch.log_softmax(logits.float(), dim=-1)[read, tok]
        return torch.zeros(len(self.n_answers), max(self.n_answers)).index_put((qs, ans), per_token, accumulate=True)

    def visibility(self) -> torch.Tensor:
        """Token i sees token j iff j is i or one of its ancestors (parents come before children)."""
        n = len(self.ids)
        seen = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parent):
            if p >= 0:
                seen[i] = seen[p]
            seen[i, i] = True
        return seen

    def sum_logprobs(self, logits: torch.Tensor, exact: Callable | None = None, rows: int = 16,
                     top_k: int = 16) -> list[list[float]]:
        """Each answer's log-likelihood: the sum of its tokens' log-probabilities. The normaliser is taken
        `rows` logits rows at a time, so no vocabulary-sized copy of all rows is made (a block stays a few
        MB: larger temporaries are fresh pages from the OS on every call, which cost more than the
        arithmetic). `exact(rows, tokens)`: the answer tokens' logits at higher precision than `logits`
        (CausalLMBackend._exact_logits); a log-probability is then capped at 0."""
        read, tok, qs, ans = (torch.tensor(c) for c in zip(*self.targets))
        per_token = torch.empty(len(read), dtype=torch.float64)
        for start in range(0, logits.shape[0], rows):
            block = logits[start:start + rows].float()
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


def _chunks(items: Sequence, budget: int, size: Callable = lambda q: q.n_tokens) -> Iterator[list]:
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


def _concat(caches: Sequence[DynamicCache]) -> DynamicCache:
    """Several states' keys/values side by side in one cache (their positions are their own)."""
    return DynamicCache(ddp_cache_data=[(torch.cat([c.layers[i].keys for c in caches], dim=2),
                                         torch.cat([c.layers[i].values for c in caches], dim=2))
                                        for i in range(len(caches[0].layers))])


def _scales_logits(cfg) -> bool:
    """Whether the model transforms its head's output (soft-capping, a logit scale): then the head's own
    logits are read as they are."""
    cfg = cfg.get_text_config(decoder=True)
    return bool(getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None))


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
