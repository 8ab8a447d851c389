"""The CPU fast paths: which precision the machine's matrix units want, linear layers whose weights oneDNN
has laid out once for them, and int8 linear layers for CPUs without bf16 units.

A CPU with AMX (amx_bf16) or AVX-512 bf16 multiplies bf16 matrices several times faster than fp32
(docs/measurements/cpu-precision.md, `prefill bench --sections fast`). So `--dtype auto`, the default, is bf16 where
the CPU reports either flag (a CPU without them emulates bf16 and gets slower, never faster). An x86 CPU without them
(AVX2 only: AMD Zen 2 and 3, many Intel desktop parts) multiplies int8 through fbgemm faster than fp32, so there auto
is int8 (`quantize_linears`: weights per output channel, activations per token, the LM head fp32), which brings the
1.5B model near what the 0.5B costs in fp32 (docs/measurements/cpu-precision.md#without-bf16-units-int8, `python -m
benchmarks.speed.no_bf16`); fp32 where there are no int8 kernels.

`torch.nn.functional.linear` hands oneDNN the weight in PyTorch's layout, and oneDNN reorders it into its
blocked layout on every call. Reordering once (`torch.ops.mkldnn._reorder_linear_weight`, what Inductor's
CPU freezing does) and calling `_linear_pointwise` gives bit-identical outputs, faster at every row count
tried, with the row hint 64 best (`python -m benchmarks.speed.fastpath --micro`). The packed copy doubles the
memory of the linear weights, so serving drops the plain ones (backends/weights.py). Only inference is packed:
with gradients on (LoRA training) the layer runs from its plain weight, read back for it.

Once the products are fast, fresh memory costs: the allocator is tuned to keep freed memory for the next pass,
and handed back after a burst (backends/allocator.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types
from collections.abc import Callable, Iterator

import torch

from ..precision import has_bf16_units
from . import allocator

PACK_ROWS_HINT = 64


def can_pack(dtype: torch.dtype) -> bool:
    return (
        dtype == torch.bfloat16
        and has_bf16_units()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack_linears(model: torch.nn.Module, release=None) -> int:
    """Give every CPU bf16 `nn.Linear` in `model` a oneDNN-reordered copy of its weight, used whenever it
    runs without gradients; returns how many were packed. Call again after the weights change (a LoRA
    merged): each layer is re-packed, or re-quantised (int8: `quantize_linears`), from its current weight.
    `release(name, module)`: called on each layer once packed (backends/weights.py `releaser`)."""
    for module in model.modules():
        if hasattr(module, "_int8"):
            _quantize(module)
    count = 0
    if can_pack(next(model.parameters()).dtype):
        allocator.tune()
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear or module.weight is None:
            continue
        if module.weight.device.type == "cpu" and can_pack(module.weight.dtype):
            with torch.no_grad():
                module._packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PACK_ROWS_HINT)
            module.forward = types.MethodType(_packed_forward, module)
            count += 1
        if release is not None:
            release(name, module)
    if count and getattr(model, "_prefill_exact_rows", False):
        row_policies(model)
    return count


def row_policies(model) -> None:
    """Exact bf16: each packed layer's row policy (backends/rowblocks.py), probed once per shape on this
    machine: the decoder's layers for passes of up to a chunk's tokens, the LM head for up to 512 rows read."""
    from . import rowblocks

    head = model.get_output_embeddings()
    layers = [m for m in model.modules() if hasattr(m, "_packed")]
    shapes = {}
    for m in layers:
        product = functools.partial(_packed_product, packed=m._packed)
        shapes.setdefault((m is head, m.in_features, m.out_features), product)
    found = {}
    for is_head in (False, True):
        mine = {(i, o): f for (h, i, o), f in shapes.items() if h == is_head}
        if mine:
            most, typical, free = (
                (EXACT_HEAD_ROWS, rowblocks.TYPICAL_HEAD, rowblocks.FREE_HEAD)
                if is_head
                else (EXACT_PASS_ROWS, rowblocks.TYPICAL, rowblocks.FREE)
            )
            policies = rowblocks.policies(mine, torch.bfloat16, most, typical, free)
            found.update({(is_head, *k): v for k, v in policies.items()})
    for m in layers:
        m._rows = found[(m is head, m.in_features, m.out_features)]


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() or x.dtype != self._packed.dtype or x.device.type != "cpu":
        return torch.nn.functional.linear(x, self.weight, self.bias)
    if _FIXED_ROWS.get() and hasattr(self, "_rows"):  # a tree pass, exact: calls of the sizes the kernel is exact on
        from .rowblocks import multiply

        out = multiply(x, functools.partial(_packed_product, packed=self._packed), self._rows)
    else:
        out = _packed_product(x, self._packed)
    return out if self.bias is None else out + self.bias


def _packed_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x (rows, in) times the packed weight: (rows, out), bf16 on the matrix units."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


# Exact bf16: a pass's products in calls of the row counts the kernel is exact on (rowblocks.py),
# probed for passes of up to this many rows (CausalLMBackend's chunk budget) and for the LM head's rows read.
EXACT_PASS_ROWS = 2048
EXACT_HEAD_ROWS = 512
_FIXED_ROWS: contextvars.ContextVar[int] = contextvars.ContextVar("prefill_fixed_rows", default=0)


def make_exact(model, dtype: str) -> None:
    """Exact bf16 (the default on a CPU with bf16 units; `--exact off` leaves it plain): a question's answer gets
    the same bits however it is packed or its request batched. Attention is the split one (`isolated_attention`),
    each state runs in a pass of its own or first in its questions' pass (`states_run_alone`), and every pass's
    products run in calls of the sizes the kernel is consistent on (`pack_linears` -> `row_policies`,
    rowblocks.py). Without it bf16 answers move by up to a few hundredths with what is packed or batched beside
    them (docs/measurements/cpu-precision.md#exact-by-default). It covers the packed tree pass, which every model
    that takes attention masks runs; models run as rows (`backends/rows.py`: masks ignored, or a sliding window
    outrun) are not covered."""
    if dtype != "bfloat16" or not can_pack(torch.bfloat16) or model.config._attn_implementation != "sdpa":
        raise ValueError(
            "--exact is for bf16 on a CPU with bf16 units (AMX or AVX-512 bf16) and SDPA attention; int8 is "
            f"exact always and float32 is the reference, not {dtype}"
        )
    isolated_attention(model)
    model._prefill_exact_rows = True  # pack_linears gives each layer its row policy


@contextlib.contextmanager
def isolated(model, tree, n_state: int, spans=None, prefix: int = 0) -> Iterator[None]:
    """While a pass runs (a tree over a cached state; a state's own; or a state then its tree, `prefix` its
    tokens): its products in the calls `make_exact` found exact, and the split attention reading the pass's
    layout where it is set (`isolated_attention`). `tree` None: a state's own pass."""
    from .exact import TreeLayout, split_attention, tree_layout

    token = _FIXED_ROWS.set(getattr(model, "_prefill_exact_rows", 0))
    try:
        if split_attention(model):
            with tree_layout(TreeLayout.of(tree, n_state, spans, prefix)):
                yield
        else:
            yield
    finally:
        _FIXED_ROWS.reset(token)


# ---------------------------------------------------------------- int8 products, a scale per token


def quantize_linears(model: torch.nn.Module) -> int:
    """Give every fp32 `nn.Linear` in `model` an int8 copy of its weight (a scale per output channel), used
    whenever it runs without gradients; returns how many. Activations are quantised per token (`_int8_forward`),
    so no row's product depends on the other rows of a pass (PyTorch's dynamic quantisation scales the whole
    pass at once, so a packed answer moved with the other questions). Call it on the decoder, not the model:
    the LM head stays fp32; and give the model `exact_attention`, the other half of keeping answers isolated."""
    torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32:
            _quantize(module)
            module.forward = types.MethodType(_int8_forward, module)
            count += 1
    return count


def _quantize(module: torch.nn.Linear) -> None:
    import warnings

    w = module.weight.detach()
    scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127).double()
    with warnings.catch_warnings():  # the quantized tensor API is deprecated, its fbgemm kernels are not
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
    module._int8 = torch.ops.quantized.linear_prepack(q, None)


def _int8_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its largest |value| and quantised on the fixed grid that spans [-1, 1] (the extra
    last row, +1 and -1, pins fbgemm's per-pass range there), multiplied in int8, scaled back per row."""
    if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
        return torch.nn.functional.linear(x, self.weight, self.bias)
    rows = x.reshape(-1, x.shape[-1])
    scale = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    pin = rows.new_zeros(1, rows.shape[1])
    pin[0, :2] = torch.tensor([1.0, -1.0])
    out = torch.ops.quantized.linear_dynamic(torch.cat([rows / scale, pin]), self._int8, True)[:-1] * scale
    out = out if self.bias is None else out + self.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def to_int8(model) -> None:
    """`--dtype int8` on a model loaded in fp32: the decoder's linears in int8 (the LM head stays fp32) and
    isolated attention; the two halves of int8 answers that do not move with their neighbours."""
    quantize_linears(model.get_decoder())
    isolated_attention(model)


def isolated_attention(model) -> bool:
    """Attention in the tree pass that gives a question's tokens the same bits however they are packed: the
    split attention (backends/exact.py), where this machine's flash kernel gives a row the same bits whatever
    rows are beside it (checked here, once per model shape); else attention in float64 throughout
    (`exact_attention`, slower). Whether either was set (the model attends through SDPA)."""
    from . import exact

    cfg = model.config.get_text_config(decoder=True)
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if exact.rows_are_independent(cfg.num_attention_heads, kv_heads, dim, next(model.parameters()).dtype):
        return exact.register(model)
    return exact_attention(model)


def exact_attention(model) -> bool:
    """Attention computed in float64 and rounded back, for a model whose linears are int8; whether it was
    set (the model attends through SDPA). Why: attention over a packed sequence blocks its keys otherwise than
    over the question alone, so its fp32 result differs in the last bits; a last-bit change that crosses an
    int8 rounding step grows through the layers, and answers moved with the questions packed beside them
    (docs/measurements/cpu-precision.md#without-bf16-units-int8 has the sizes). In float64 the last bits still differ,
    but rounded to fp32 they are the same bits but by the rarest chance, and the answers are as isolated as fp32's. At a
    question's length attention is a small part of a pass, so it costs little (measured there too)."""
    from transformers import AttentionInterface

    if model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(EXACT_ATTENTION, _float64_sdpa)
    model.config._attn_implementation = EXACT_ATTENTION
    return True


EXACT_ATTENTION = "prefill-float64-sdpa"


def states_run_alone(model) -> bool:
    """Whether each state must run in a pass of its own rather than side by side with other requests' states
    (`CausalLMBackend.score_many`): yes under `exact_attention`. A state alone attends in fp32 (plain causal
    attention), states side by side in float64 (they need a mask), and the two differ in the last bits, which
    int8's rounding (and bf16's, under `make_exact`) grows: in int8, batched requests' answers moved by tenths
    from the same requests asked one by one (docs/measurements/cpu-precision.md#without-bf16-units-int8). Alone, a
    state gets the same bits however requests arrive; the tree pass that reads several states is masked, hence float64,
    hence the same bits too."""
    from .exact import SPLIT_ATTENTION

    return model.config._attn_implementation in (EXACT_ATTENTION, SPLIT_ATTENTION)


def _float64_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    # Plain causal attention over one sequence (a state, run alone: `states_run_alone`) has no neighbours to move
    # it; training (LoRA) runs the fp32 weights, not the int8 ones (`_int8_forward`): no rounding step to cross.
    if attention_mask is None or torch.is_grad_enabled():
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask.is_floating_point():
        attention_mask = attention_mask.double()
    key, value = key.double(), value.double()
    out, weights = sdpa_attention_forward(module, query.double(), key, value, attention_mask, **kwargs)
    return out.to(query.dtype), weights


# ---------------------------------------------------------------- exact answer logits in bf16


@contextlib.contextmanager
def head_input(model, dtype: torch.dtype) -> Iterator[list[torch.Tensor]]:
    """While the block runs, what the LM head reads (the final hidden states of the rows it scores).
    Only under reduced precision with a plain linear head (see `exact_logits`)."""
    captured: list[torch.Tensor] = []
    head = model.get_output_embeddings()
    if dtype == torch.float32 or type(head) is not torch.nn.Linear or _scales_logits(model.config):
        yield captured
        return
    hook = head.register_forward_pre_hook(lambda _m, args: captured.append(args[0][0]))
    try:
        yield captured
    finally:
        hook.remove()


def exact_logits(model, head_input: list[torch.Tensor]) -> Callable | None:
    """In bf16 the head's logits are rounded to 8 significant bits (a logit of 20 to within 0.06), as much
    error as the whole bf16 body adds to an answer. So `sum_logprobs` recomputes in fp32, from the head's
    input, the logits of the answer tokens and the row's largest ones (which make its normaliser); the
    rest of the vocabulary stays bf16: a top-k and a few dot products, where an fp32 head would cost
    several times the bf16 one, for the same answers (docs/measurements/cpu-precision.md, measured by `python -m
    benchmarks.speed.fastpath --micro` and `--precision`). Returns exact(rows (n,), tokens (n, k)) -> (n, k) fp32
    logits, or None."""
    if not head_input:
        return None
    hidden = head_input[0]
    head = model.get_output_embeddings()

    def exact(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """rows (n,), tokens (n, k) -> their logits (n, k) in fp32."""
        out = torch.einsum("nh,nkh->nk", hidden[rows].float(), head.weight[tokens].float())
        return out + head.bias[tokens].float() if head.bias is not None else out

    return exact


def _scales_logits(cfg) -> bool:
    """Whether the model transforms its head's output (soft-capping, a logit scale): then the head's own
    logits are read as they are."""
    cfg = cfg.get_text_config(decoder=True)
    return bool(getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None))
