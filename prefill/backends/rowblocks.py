"""Products whose rows get the same bits whatever else is in the pass: calls of the sizes the kernel is
consistent on, found by asking it.

oneDNN picks its bf16 kernel (and with it the order a row's sums are taken in) by the shape of the product, rows
included: on the Xeon with AMX, a row of the 1,536 x 8,960 projection gets other bits in a pass of 32 rows than in
one of 48 or more; the 8,960 x 1,536 one changes its mind up to 256 rows; the 1,536 x 1,536 one again past 704
(python -m benchmarks.speed.fastpath --exact prints them). Fixed blocks of rows (every call exactly B rows)
make a row's bits independent of the pass, but splitting a pass into many calls streams every weight once a call,
and padding a small pass to B rows multiplies rows nobody asked about: blocks of 128 cost the 1.5B's 21-question
request 17 % and its one-question request 20 %.

So for each shape of weight the model has, `probe` finds the row counts the kernel is consistent on: a block B and
a most M such that every multiple of B up to M gives a row the same bits as blocks of B. A pass is then padded to
a multiple of B and multiplied in calls of at most M rows: one call for most passes, the padding under B rows.
Where the kernel never changes its mind (the AMD machine without AMX was seen so), B is 16 and M the whole pass.
The probe multiplies random rows at every such count once per shape (a few seconds on the Xeon), and its findings
are kept on disk for this CPU, torch and thread count (`~/.cache/prefill/rowblocks.json`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

CANDIDATES = (16, 32, 48, 64, 96, 128, 192, 256)
# What a pass of each size is worth in choosing a policy: a one-question request (its tree pass is ~24 rows), a
# request of ~20 questions (~400), a full chunk (2,048; chunk_tokens). A call costs about as much as this many rows
# more (the weight streamed once more: the 8,960 x 1,536 product on the Xeon, 0.4 ms a call, 0.012 ms a row).
TYPICAL = {24: 2.0, 400: 1.0, 2048: 0.2}
CALL_ROWS = 32


@dataclass(frozen=True)
class RowPolicy:
    block: int  # a pass's rows are padded to a multiple of this
    most: int  # and multiplied in calls of at most this many rows (a multiple of `block`)

    def calls(self, rows: int) -> list[int]:
        padded = -(-rows // self.block) * self.block
        return [min(self.most, padded - start) for start in range(0, padded, self.most)]

    def cost(self, rows: int) -> int:
        sizes = self.calls(rows)
        return sum(sizes) + CALL_ROWS * len(sizes)


def multiply(x: torch.Tensor, product: Callable, policy: RowPolicy) -> torch.Tensor:
    """x's rows (any leading shape) multiplied in the calls `policy` makes, the last padded with zeros."""
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    sizes = policy.calls(n)
    padded = torch.cat([flat, flat.new_zeros(sum(sizes) - n, flat.shape[1])]) if sum(sizes) > n else flat
    out = torch.cat([product(part) for part in padded.split(sizes)])[:n] if len(sizes) > 1 else product(padded)[:n]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def probe(product: Callable, in_features: int, dtype: torch.dtype, most: int) -> RowPolicy:
    """The cheapest policy (over TYPICAL passes) for `product` (rows -> rows), among blocks of CANDIDATES rows,
    each with the largest multiple of it up to `most` rows for which every multiple gives each row the bits that
    blocks of it give."""
    x = torch.randn(most + max(CANDIDATES), in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    found = []
    for block in CANDIDATES:
        blocks = torch.cat([product(part) for part in x[: -(-most // block) * block].split(block)])
        largest = block
        for rows in range(2 * block, most + 1, block):
            if not torch.equal(product(x[:rows]), blocks[:rows]):
                break
            largest = rows
        found.append(RowPolicy(block, largest))
        if largest + block > most:  # consistent for every pass: a larger block only pads more
            break
    return min(found, key=lambda p: sum(w * p.cost(rows) for rows, w in TYPICAL.items()))


def policies(shapes: dict[tuple[int, int], Callable], dtype: torch.dtype, most: int) -> dict[tuple, RowPolicy]:
    """A policy per (in, out) shape, read from the cache or probed (and saved): the probe says what it does."""
    from ..loading import cache_dir

    path = cache_dir() / "rowblocks.json"
    key = _machine(dtype, most)
    saved = json.loads(path.read_text()) if path.is_file() else {}
    mine = saved.setdefault(key, {})
    out = {}
    for (n_in, n_out), product in shapes.items():
        name = f"{n_in}x{n_out}"
        if name not in mine:
            print(
                f"prefill: finding the row counts this CPU's {n_in} x {n_out} product is exact on (once)",
                file=sys.stderr,
            )
            mine[name] = asdict(probe(product, n_in, dtype, most))
        out[(n_in, n_out)] = RowPolicy(**mine[name])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=1))
    return out


def _machine(dtype: torch.dtype, most: int) -> str:
    """What a kernel's choices depend on: the CPU, the library versions, the threads, the precision."""
    from ..precision import cpu_flags

    try:
        model = next(line for line in open("/proc/cpuinfo") if line.startswith("model name")).split(":", 1)[1].strip()
    except (OSError, StopIteration):
        model = "unknown"
    parts = [
        model,
        ",".join(sorted(cpu_flags())),
        torch.__version__,
        str(torch.get_num_threads()),
        str(dtype),
        str(most),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
