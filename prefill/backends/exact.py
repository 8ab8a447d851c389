"""Attention that gives a question's tokens the same bits however the question is packed or its request batched.

Over a packed tree, plain attention sums a token's keys in an order that depends on where they sit in the
sequence (the kernel blocks the keys by index), so a question's answer moves in its last bits with the questions
packed beside it; in bf16 or int8 the last bits cross a rounding step and the answer moves by hundredths. This
splits each tree token's attention in two parts whose computation does not depend on the packing:

- **the state part**: the tree tokens of a state attend to that state's keys in the CPU flash kernel, in blocks
  of exactly QUERY_BLOCK query rows: the keys are the same tensor whatever is asked, and the kernel gives a row
  the same bits whatever other rows share its block;
- **the chain part**: each token attends to its own ancestors in the tree, laid out from the state down (a row
  at depth d sees keys 0..d), in elements of CHAIN_ROWS rows whose key count depends only on the row's depth
  (`key_size`): the kernel gives a row the same bits whatever the keys it does not see hold and whatever other
  elements share the call;

merged elementwise by their log-sum-exps (`_shares`). `rows_are_independent` checks both properties on this
machine at load, for the model's shape; where they fail, attention runs in float64 instead (cpu.exact_attention).
A state's own tokens (its own pass, or the start of a pass that runs its questions after it: `prefix`) attend
causally in one call whose shape is the state's alone (`state_itself`), so both give its keys the same bits.
Measured against plain bf16 and the earlier float64 attention: docs/measurements/cpu-precision.md#exact-by-default.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

SPLIT_ATTENTION = "prefill-split-sdpa"
KV_BLOCK = 512  # the CPU flash kernel's key block (kv_split_size)
QUERY_BLOCK = 64  # query rows a call (in bf16, 32 took 1.7x the time of 64, 128 about the same)
CHAIN_ROWS = 16  # tree rows an element of the chain part's call
CHAIN_KEYS = 32  # the fewest keys an element holds (rows deeper than that: twice as many, and so on)
_LAYOUT: contextvars.ContextVar[TreeLayout | None] = contextvars.ContextVar("prefill_tree_layout", default=None)


@dataclass
class Chains:
    """Tree rows' chain parts laid out for one flash-attention call: `rows` (elements, CHAIN_ROWS) the tree rows
    computed (padding rows repeat a real one), `keys` (elements, size) each element's keys, the ancestors of its
    rows in order from the state (so a row at depth d sees keys 0..d, whatever element it is in), `visible`
    (elements, CHAIN_ROWS, size) which key each row sees, `real` which of the flattened rows are not padding."""

    rows: torch.Tensor
    keys: torch.Tensor
    visible: torch.Tensor
    real: torch.Tensor
    _masks: dict = field(default_factory=dict, repr=False)

    @functools.cached_property
    def real_rows(self) -> torch.Tensor:
        return self.rows.reshape(-1)[self.real]

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask (elements, 1, rows, size) in `dtype`, made once per pass."""
        if dtype not in self._masks:
            hidden = torch.zeros(self.visible.shape, dtype=dtype).masked_fill_(~self.visible, float("-inf"))
            self._masks[dtype] = hidden[:, None]
        return self._masks[dtype]


@dataclass
class TreeLayout:
    """What a tree pass's attention needs: each state's span of cache columns and its tree rows, and the chain
    parts, one call per key size."""

    states: list[tuple[int, int, torch.Tensor]]  # (first cache column, last + 1, tree rows)
    chains: list[Chains]
    prefix: int = 0  # a state's own tokens run first in the same pass (causal among themselves; `state_first`)

    @functools.cached_property
    def chain_order(self) -> torch.Tensor:
        """Where each tree row is among the chain parts' outputs, concatenated."""
        computed = torch.cat([c.real_rows for c in self.chains])
        return torch.empty_like(computed).index_copy_(0, computed, torch.arange(len(computed)))

    @classmethod
    def of(cls, tree, n_cache: int, spans: Sequence[tuple[int, int]] | None = None, prefix: int = 0) -> TreeLayout:
        """`prefix`: the pass runs the state's `n_cache` tokens first (the state has no cache yet)."""
        if tree is None:  # a state's own pass
            return cls([], [], prefix)
        groups = torch.tensor(tree.group)
        spans = spans or [(0, n_cache)]
        states = [(start, stop, (groups == g).nonzero().squeeze(1)) for g, (start, stop) in enumerate(spans)]
        return cls([s for s in states if len(s[2])], _chains(tree.parent), prefix)


def key_size(depth: int) -> int:
    """The keys a row at `depth` (its ancestors in the tree) is computed against: the row's bits depend on this
    number, so it is a function of the row's depth alone (CHAIN_KEYS, doubled as needed)."""
    size = CHAIN_KEYS
    while size <= depth:
        size *= 2
    return size


def _chains(parent: list[int]) -> list[Chains]:
    """Every tree row in exactly one element: rows are taken along root-to-tip paths, deepest tips first, each
    row into the element of its key size on the first path that reaches it."""
    chain: list[list[int]] = []
    for i, p in enumerate(parent):  # parents come before children
        chain.append((chain[p] if p >= 0 else []) + [i])
    done = [False] * len(parent)
    elements: dict[int, list[tuple[list[int], list[int]]]] = {}
    for tip in sorted(range(len(parent)), key=lambda i: -len(chain[i])):
        if done[tip]:
            continue
        todo = [i for i in chain[tip] if not done[i]]
        for i in todo:
            done[i] = True
        by_size: dict[int, list[int]] = {}
        for i in todo:
            by_size.setdefault(key_size(len(chain[i]) - 1), []).append(i)
        for size, rows in by_size.items():
            for start in range(0, len(rows), CHAIN_ROWS):
                elements.setdefault(size, []).append((rows[start : start + CHAIN_ROWS], chain[tip][:size]))
    return [_element_batch(size, batch, chain) for size, batch in sorted(elements.items())]


def _element_batch(size: int, batch: list[tuple[list[int], list[int]]], chain: list[list[int]]) -> Chains:
    rows = torch.zeros(len(batch), CHAIN_ROWS, dtype=torch.long)
    keys = torch.zeros(len(batch), size, dtype=torch.long)  # padding keys: node 0, never seen
    visible = torch.zeros(len(batch), CHAIN_ROWS, size, dtype=torch.bool)
    real = torch.zeros(len(batch), CHAIN_ROWS, dtype=torch.bool)
    for e, (r, k) in enumerate(batch):
        rows[e, : len(r)], rows[e, len(r) :] = torch.tensor(r), r[0]
        keys[e, : len(k)] = torch.tensor(k)
        depths = torch.tensor([len(chain[i]) - 1 for i in r] + [len(chain[r[0]]) - 1] * (CHAIN_ROWS - len(r)))
        visible[e] = torch.arange(size)[None, :] <= depths[:, None]
        real[e, : len(r)] = True
    return Chains(rows, keys, visible, real.reshape(-1))


@contextlib.contextmanager
def tree_layout(layout: TreeLayout) -> Iterator[None]:
    """While a tree pass runs: the layout the split attention reads."""
    token = _LAYOUT.set(layout)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def split_attention(model) -> bool:
    """Whether `model` attends through the split attention (`register`)."""
    return model.config._attn_implementation == SPLIT_ATTENTION


def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface: the split attention in a tree pass (see the module's docstring),
    plain SDPA elsewhere (a state's own pass, which runs alone; training, which reads fp32 weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = kwargs.pop("_layout", None)
    if layout is not None:  # the tree rows of a pass that ran its state first
        layout = TreeLayout(layout.states, layout.chains)
    else:
        layout = _LAYOUT.get()
    if layout is None or torch.is_grad_enabled() or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = query[0], key[0], value[0]  # (heads, tokens, dim); kv heads broadcast
    if layout.prefix:  # the state's own tokens, causal, as its own pass runs them: the same call, the same bits
        first = state_itself(q[:, : layout.prefix], k[:, : layout.prefix], v[:, : layout.prefix], scale)
        if not layout.chains:
            return first.transpose(0, 1)[None], None
        rest, _ = attend(module, query[:, :, layout.prefix :], key, value, None, scaling=scale, _layout=layout)
        return torch.cat([first.transpose(0, 1)[None], rest], 1), None
    n = q.shape[1]
    if len(layout.states) == 1 and len(layout.states[0][2]) == n:  # one state, read by every row (most passes)
        start, stop, _ = layout.states[0]
        state_out, state_lse = state_part(q, k[:, start:stop], v[:, start:stop], scale)
    else:
        state_out = q.new_empty(q.shape)
        state_lse = torch.empty(q.shape[:2], dtype=torch.float32)
        for start, stop, rows in layout.states:
            part_out, part_lse = state_part(q.index_select(1, rows), k[:, start:stop], v[:, start:stop], scale)
            state_out.index_copy_(1, rows, part_out.to(q.dtype))
            state_lse.index_copy_(1, rows, part_lse.float())
    parts = [chain_part(q, k[:, -n:], v[:, -n:], chains, scale) for chains in layout.chains]
    chain_out = torch.cat([o for o, _ in parts], 1).index_select(1, layout.chain_order)  # back in row order
    chain_lse = torch.cat([lse for _, lse in parts], 1).index_select(1, layout.chain_order)
    own, chain = _shares(state_lse, chain_lse)
    out = state_out.float().mul_(own[..., None]).add_(chain_out.float().mul_(chain[..., None]))  # elementwise exact
    return out.to(query.dtype).transpose(0, 1)[None], None


def _shares(lse_a: torch.Tensor, lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each part's share of a row's attention, from their log-sum-exps, in fp32. Computed in float64: an
    elementwise exp or log takes a vectorised path for most elements and a scalar one for the last few, which
    differ in the last bit, and which rows are last depends on the packing; in float64 that bit is rounded
    away."""
    a, b = lse_a.double(), lse_b.double()
    total = torch.logaddexp(a, b)
    return torch.exp(a - total).float(), torch.exp(b - total).float()


def state_itself(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A state's tokens attending to themselves, causally: (heads, tokens, dim) in the queries' precision. One
    flash call whose shape is the state's alone, so its own pass and a pass that runs a tree after it give the
    same bits."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return op(q[None], k[None], v[None], 0.0, is_causal=True, scale=scale)[0][0]


def state_part(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(heads, rows, dim) queries against a state's (kv heads, keys, dim): the flash kernel's output and
    log-sum-exp. The kernel gives a row the same bits whatever rows share its call only in calls of a fixed number
    of rows (in bf16 it multiplies on the matrix units, whose kernels choose by the row count; in fp32 it folds the
    query heads that share a key head into its rows), so the rows go in blocks of QUERY_BLOCK, the last padded.
    A key block of one to three keys makes a row depend on the others (seen on the Xeon with AMX), so such a tail
    is split off into a call of its own, by the state's length alone, and the two merged in float64."""
    n = k.shape[1]
    if n <= 3:
        return _float64_attention(q, _repeat(k, q), _repeat(v, q), scale)
    tail = n % KV_BLOCK
    if tail == 0 or tail > 3 or n < KV_BLOCK:
        return _flash(q, k, v, scale)
    cut = n - tail - KV_BLOCK // 2
    return _merge(_flash(q, k[:, :cut], v[:, :cut], scale), _flash(q, k[:, cut:], v[:, cut:], scale))


def _flash(q, k, v, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel over (heads, rows, dim) queries in blocks of QUERY_BLOCK rows, the blocks as one call's
    batch (each block is computed on its own, so this is the same bits as a call per block)."""
    heads, n, dim = q.shape
    blocks = -(-n // QUERY_BLOCK)
    padded = torch.cat([q, q.new_zeros(heads, blocks * QUERY_BLOCK - n, dim)], 1) if n % QUERY_BLOCK else q
    qs = padded.reshape(heads, blocks, QUERY_BLOCK, dim).transpose(0, 1)
    ks, vs = (t[None].expand(blocks, *t.shape) for t in (k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qs, ks, vs, 0.0, scale=scale)
    out = out.transpose(0, 1).reshape(heads, blocks * QUERY_BLOCK, dim)[:, :n]
    return out, lse.transpose(0, 1).reshape(heads, blocks * QUERY_BLOCK)[:, :n]


def _merge(a, b):
    (out_a, lse_a), (out_b, lse_b) = [(o.double(), s.double()) for o, s in (a, b)]
    total = torch.logaddexp(lse_a, lse_b)
    merged = out_a * torch.exp(lse_a - total)[..., None] + out_b * torch.exp(lse_b - total)[..., None]
    return merged.float(), total.float()


def _repeat(kv: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kv.repeat_interleave(q.shape[0] // kv.shape[0], dim=0)


def _float64_attention(q, k, v, scale, visible=None):
    scores = torch.einsum("...qd,...kd->...qk", q.double(), k.double()) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("...qk,...kd->...qd", weights, v.double()), lse


def chain_part(q, tree_k, tree_v, chains: Chains, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each tree row against its own ancestors in the tree: (heads, real rows, dim) outputs and (heads, real rows)
    log-sum-exps, in `chains.real_rows`' order. One flash call for every element of a key size: a row's bits
    depend on its own keys, the key size and the fixed CHAIN_ROWS, never on the other rows or elements, nor on
    the keys it does not see (`rows_are_independent` checks it at start-up)."""
    heads, dim = q.shape[0], q.shape[-1]
    n_elements, size = chains.keys.shape
    qs = q.index_select(1, chains.rows.reshape(-1)).reshape(heads, n_elements, CHAIN_ROWS, dim).transpose(0, 1)
    ks = tree_k.index_select(1, chains.keys.reshape(-1)).reshape(-1, n_elements, size, dim).transpose(0, 1)
    vs = tree_v.index_select(1, chains.keys.reshape(-1)).reshape(-1, n_elements, size, dim).transpose(0, 1)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = op(qs, ks, vs, 0.0, attn_mask=chains.mask(q.dtype), scale=scale)
    out = out.transpose(0, 1).reshape(heads, -1, dim)[:, chains.real]
    return out, lse.transpose(0, 1).reshape(heads, -1)[:, chains.real]


def register(model) -> bool:
    """Use the split attention in `model` (one that attends through SDPA); whether it was set."""
    from transformers import AttentionInterface

    if model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(SPLIT_ATTENTION, attend)
    model.config._attn_implementation = SPLIT_ATTENTION
    return True


@functools.cache
def rows_are_independent(heads: int = 4, kv_heads: int = 1, dim: int = 64, dtype: torch.dtype = torch.float32) -> bool:
    """Whether, on this machine, both parts give a row the same bits whatever else is in the call (what the split
    attention rests on; checked once per model shape at load): the state part whatever other rows share its call
    and wherever the row sits among them, for states of lengths the kernel blocks otherwise; the chain part
    whatever other rows and elements share the call and whatever the keys the row does not see hold."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q = randn(heads, 300, dim)
    for n in (5, 40, 511, 512, 513, 600, 1026, 1030):
        k, v = randn(kv_heads, n, dim), randn(kv_heads, n, dim)
        alone = state_part(q[:, 5:8], k, v, dim**-0.5)
        for m in (17, 64, 300):
            beside = state_part(q[:, :m], k, v, dim**-0.5)
            if not (torch.equal(beside[0][:, 5:8], alone[0]) and torch.equal(beside[1][:, 5:8], alone[1])):
                return False
    for depth in (0, 9, CHAIN_KEYS - 1, CHAIN_KEYS + 5):  # a row's own keys, in two calls that differ otherwise
        size = key_size(depth)
        row, k, v = randn(heads, dim), randn(kv_heads, depth + 1, dim), randn(kv_heads, depth + 1, dim)
        seen = []
        for elements, at in ((1, 0), (5, CHAIN_ROWS - 1)):
            qs = randn(elements, heads, CHAIN_ROWS, dim)
            ks, vs = randn(elements, kv_heads, size, dim), randn(elements, kv_heads, size, dim)
            visible = torch.rand(elements, CHAIN_ROWS, size, generator=gen) < 0.5
            visible[..., 0] = True
            qs[-1, :, at], ks[-1, :, : depth + 1], vs[-1, :, : depth + 1] = row, k, v
            visible[-1, at] = torch.arange(size) <= depth
            chains = Chains(torch.zeros(1), torch.zeros(1), visible, torch.zeros(1))
            op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
            out, lse = op(qs, ks, vs, 0.0, attn_mask=chains.mask(dtype), scale=dim**-0.5)
            seen.append((out[-1, :, at], lse[-1, :, at]))
        if not (torch.equal(seen[0][0], seen[1][0]) and torch.equal(seen[0][1], seen[1][1])):
            return False
    return True
