"""Which precision a model runs in: what the CPU's matrix units want, what was asked, what `auto` picks.

Decided here, once, on the ground floor, with torch imported only by the calls that need it (so building the
command line's parser imports none). The kernels that run each precision are in backends/cpu.py.

A CPU with AMX (amx_bf16) or AVX-512 bf16 multiplies bf16 matrices several times faster than fp32, so `auto`
is bf16 there (a CPU without them emulates bf16 and gets slower, never faster). An x86 CPU without them (AVX2
only: AMD Zen 2 and 3, many Intel desktop parts) multiplies int8 through fbgemm faster than fp32, so there
`auto` is int8; fp32 where there are no int8 kernels either. Where both run well (AVX-512 bf16 and VNNI without
AMX, the AMD Zen 4 kind) int8 answers 16 % sooner in a quarter less memory, but moves 5 of the real-task suite's
17 cells by more than 0.02 against bf16 (2026-12-07), so `auto` stays bf16 there (docs/models-and-precision.md, with the
measurements behind each choice in docs/measurements/cpu-precision.md).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_bf16_units() -> bool:
    """Whether the CPU multiplies bf16 matrices in hardware (AMX or AVX-512 bf16)."""
    return any(f in cpu_flags() for f in BF16_FLAGS)


def has_int8_kernels() -> bool:
    """Whether fbgemm's int8 matrix products run here (an x86 CPU with AVX2)."""
    import torch

    engines = torch.backends.quantized.supported_engines
    return "avx2" in cpu_flags() and ("x86" in engines or "fbgemm" in engines)


def asked_dtype(dtype: str | None) -> str:
    """The precision asked for: `dtype`, else the environment's PREFILL_DTYPE, else "auto"."""
    return dtype or os.environ.get("PREFILL_DTYPE") or "auto"


def resolve_dtype(dtype: str | None) -> str:
    """ "auto" -> bfloat16 on a GPU or on a CPU with bf16 matrix units; on an x86 CPU without them, int8
    (products in int8, a scale per token: the 1.5B model near the 0.5B's fp32 time); float32 elsewhere. Others
    as given. None: the environment's PREFILL_DTYPE, else "auto" (the test suite sets float32, the exact
    reference path its 1e-4 checks are written for; bf16 and int8 are tested on their own)."""
    dtype = asked_dtype(dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if dtype != "auto":
        return dtype
    import torch

    if torch.cuda.is_available() or has_bf16_units():
        return "bfloat16"
    return "int8" if has_int8_kernels() else "float32"


def torch_dtype(dtype: str):
    """The torch dtype a model is loaded in: int8 is an fp32 model whose linear layers are then quantised."""
    import torch

    return torch.float32 if dtype == "int8" else getattr(torch, dtype)
