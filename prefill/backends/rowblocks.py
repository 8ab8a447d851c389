"""Products whose rows get the same bits whatever else is in the pass: calls of the sizes the kernel is
consistent on, found by asking it.

oneDNN picks its bf16 kernel (and with it the order a row's sums are taken in) by the shape of the product, rows
included: on the Xeon with AMX a row of the 1,536 x 8,960 projection gets other bits in a call of 32 rows than in
one of 48 or more; the 8,960 x 1,536 one is consistent from 48 rows to 112 and again from 256 on; the 1,536 x 1,536
one from 64 to 752. Fixed blocks of rows (every call exactly B rows) make a row's bits independent of the pass,
but splitting a pass into many calls streams every weight once a call, and padding a small pass multiplies rows
nobody asked about: blocks of 128 cost the 1.5B's 21-question request 17 % and its one-question request 20 %.

So for each shape of weight the model has, `probe` finds ranges of call sizes the kernel is consistent on: a
least L and a most M such that every multiple of STEP rows from L to M gives a row the bits a call of L rows gives
it, wherever the row sits. A pass is padded to L rows at least and multiplied in as few calls of at most M rows
as it takes (`RowPolicy.calls`). Among the ranges found it keeps the one that slows the TYPICAL passes least
relative to one plain call each, timed here. Where the kernel never changes its mind (the AMD machine without AMX
was seen so), L is 16 and M the whole pass. Padding costs most where passes are small and the products bound by
arithmetic, so small sizes are also tried one by one (up to FREE rows): a pass in the longest run of them that
agrees with the calls of L rows is one call, unpadded (`free_range`; on the AMD machine, every size from 1 or 2).
The probe runs once per weight shape and machine, at the first load, and its findings are kept for this CPU,
torch, thread count and precision (`~/.cache/prefill/rowblocks.json`). It multiplies every size it vouches for,
twice: for the 1.5B, 82 s on the AMD EPYC with AVX-512 bf16 and no AMX (a first start of 95 s against 13 s with
the policies kept; 2026-12-07), less on the Xeon, whose products are several times faster.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

STEP = 16  # call sizes are multiples of this (the matrix units' tile height)
CANDIDATES = (16, 32, 48, 64, 96, 128, 192, 256)  # the fewest rows a call may have
# The passes a policy is chosen for, by their measured time, weighted by how often a server sees each: a new
# state runs in one pass with its questions (CausalLMBackend._state_then_tree), so a ticket of ~400 tokens with
# twenty questions is a pass of ~800 rows and with one question ~400; a cached state's tree runs alone, ~400 rows
# for twenty questions and ~24 for one. The LM head reads a row or two for one question and ~30 for twenty (a
# question's last prompt token, and one per answer token after its first).
TYPICAL = {24: 1.0, 400: 2.0, 800: 1.0}
TYPICAL_HEAD = {2: 2.0, 30: 1.0}
# Sizes tried one by one for a range run unpadded (`free_range`): on the AMD EPYC without AMX every size but 1 is
# consistent, and padding a cached state's one-question pass (~24 rows) to 32 cost its request 21 % there. Above
# these, padding to a multiple of STEP adds at most an eighth (the LM head: a sixth at 96 rows).
FREE = 128
FREE_HEAD = 48


@dataclass(frozen=True)
class RowPolicy:
    least: int  # every call has at least this many rows (a pass padded with zero rows to reach it)
    most: int  # and at most this many, a multiple of STEP
    step: int = STEP
    # and a pass of any size from free_least to free_most is one call, unpadded (0, 0: none found)
    free_least: int = 0
    free_most: int = 0

    def calls(self, rows: int) -> list[int]:
        """The call sizes for a pass of `rows` rows: one call where `rows` is in the free range; else as few
        calls as `most` allows, of near-equal sizes, each a multiple of `step` in [least, most] (their sum may
        pass `rows`: the rest is padding)."""
        if self.free_least <= rows <= self.free_most:
            return [rows]
        padded = max(self.least, -(-rows // self.step) * self.step)
        n = -(-padded // self.most)
        units = padded // self.step
        return [max(self.least, self.step * (units // n + (i < units % n))) for i in range(n)]


def multiply(x: torch.Tensor, product: Callable, policy: RowPolicy) -> torch.Tensor:
    """x's rows (any leading shape) multiplied in the calls `policy` makes, the last padded with zeros."""
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    sizes = policy.calls(n)
    padded = torch.cat([flat, flat.new_zeros(sum(sizes) - n, flat.shape[1])]) if sum(sizes) > n else flat
    out = torch.cat([product(part) for part in padded.split(sizes)])[:n] if len(sizes) > 1 else product(padded)[:n]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _references(product: Callable, x: torch.Tensor, least: int, most: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """At two offsets into x, `most` rows and their products in calls of exactly `least` rows: the bits every
    other call size is checked against."""
    rows = [x[shift : shift + most] for shift in (0, 7)]
    return [(r, multiply(r, product, RowPolicy(least, least, least))) for r in rows]


def _agrees(product: Callable, references: list[tuple[torch.Tensor, torch.Tensor]], size: int) -> bool:
    return all(torch.equal(product(rows[:size]), reference[:size]) for rows, reference in references)


def consistent(product: Callable, x: torch.Tensor, least: int, most: int) -> int:
    """The largest size up to `most` such that every call of a multiple of STEP rows from `least` to it gives
    each row the bits a call of `least` rows gives it, wherever the row sits (checked at two offsets); 0 if
    none."""
    references = _references(product, x, least, most)
    size = least
    while size <= most and _agrees(product, references, size):
        size += STEP
    return size - STEP if size > least else 0


def free_range(product: Callable, x: torch.Tensor, least: int, most: int) -> tuple[int, int]:
    """The longest run of consecutive call sizes up to `most` (every size, not only multiples of STEP) that
    give each row the bits calls of `least` rows give it, wherever it sits (two offsets); (0, 0) if none of
    STEP sizes or more."""
    references = _references(product, x, least, most)
    best, start = (0, -1), None
    for size in range(1, most + 2):
        if size <= most and _agrees(product, references, size):
            start = start or size
        elif start:
            best = max(best, (start, size - 1), key=lambda run: run[1] - run[0])
            start = None
    return best if best[1] - best[0] + 1 >= STEP else (0, 0)


def probe(
    product: Callable, in_features: int, dtype: torch.dtype, most: int, typical: dict[int, float] = TYPICAL
) -> RowPolicy:
    """The policy that slows the `typical` passes least, relative to one plain call each (timed here), for
    `product` (rows -> rows), among those whose calls all give a row the same bits: for each least call size in
    CANDIDATES, the largest range of sizes above it. Relative, not absolute: padding a 24-row pass to 256 rows
    adds less time than splitting an 800-row one in seven, but makes a cached state's one-question request
    half as fast again, where splitting costs every pass a similar share."""
    x = torch.randn(most + 7, in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    found = []
    for least in CANDIDATES:
        largest = consistent(product, x, least, most)
        if largest >= least:
            found.append(RowPolicy(least, largest))
            if largest + STEP > most:  # consistent for every pass: a larger least only pads more
                break
    if not found:
        return RowPolicy(most, most, most)  # blocks of the largest size: the same bits by construction
    plain = {rows: _seconds(product, x, rows, RowPolicy(rows, rows, 1)) for rows in typical}
    return min(found, key=lambda p: sum(w * _seconds(product, x, rows, p) / plain[rows] for rows, w in typical.items()))


def _seconds(product: Callable, x: torch.Tensor, rows: int, policy: RowPolicy, repeats: int = 3) -> float:
    multiply(x[:rows], product, policy)
    started = time.perf_counter()
    for _ in range(repeats):
        multiply(x[:rows], product, policy)
    return (time.perf_counter() - started) / repeats


def policies(
    shapes: dict[tuple[int, int], Callable],
    dtype: torch.dtype,
    most: int,
    typical: dict[int, float] = TYPICAL,
    free: int = FREE,
) -> dict[tuple, RowPolicy]:
    """A policy per (in, out) shape, read from the cache or probed (and saved): the probe says what it does. A
    policy kept before free ranges were probed gets its free range alone (seconds, not the whole probe)."""
    from ..loading import cache_dir

    path = cache_dir() / "rowblocks.json"
    key = _machine(dtype, most) + "-v5"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    mine = saved.setdefault(key, {})
    out = {}
    missing = [f"{n_in}x{n_out}" for n_in, n_out in shapes if "free_most" not in mine.get(f"{n_in}x{n_out}", {})]
    started = time.perf_counter()
    for (n_in, n_out), product in shapes.items():
        name = f"{n_in}x{n_out}"
        if name in missing:
            print(
                f"prefill: [{missing.index(name) + 1}/{len(missing)}] finding the row counts this CPU's {n_in} x"
                f" {n_out} product is exact on (once per machine; {time.perf_counter() - started:.0f} s so far)",
                file=sys.stderr,
            )
            policy = RowPolicy(**mine[name]) if name in mine else probe(product, n_in, dtype, most, typical)
            x = torch.randn(free + 7, n_in, generator=torch.Generator().manual_seed(0)).to(dtype)
            least, most_free = free_range(product, x, policy.least, free)
            mine[name] = asdict(replace(policy, free_least=least, free_most=most_free))
        out[(n_in, n_out)] = RowPolicy(**mine[name])
    if missing:
        print(f"prefill: row counts found in {time.perf_counter() - started:.0f} s, kept in {path}", file=sys.stderr)
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
