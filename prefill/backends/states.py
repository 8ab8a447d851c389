"""States' keys/values: kept for the next request about the same state, and several states run side by side
in one pass (each at its own positions, seeing only itself) then cut apart."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from transformers import DynamicCache


class StateCache:
    """Keys/values of recent states by their tokens, up to `budget` tokens in all, least recently used out
    first; `hits` and `misses` count the lookups (served as metrics)."""

    def __init__(self, budget: int):
        self.budget = budget
        self._entries: OrderedDict[tuple[int, ...], DynamicCache] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def lookup(
        self, states: Sequence[Sequence[int]]
    ) -> tuple[dict[tuple[int, ...], DynamicCache], list[tuple[int, ...]]]:
        """The cached states found, and the distinct ones missing, in order."""
        found: dict[tuple[int, ...], DynamicCache] = {}
        missing: list[tuple[int, ...]] = []
        for key in map(tuple, states):
            if key in found or key in missing:
                continue
            if key in self._entries:
                self._entries.move_to_end(key)
                found[key] = self._entries[key]
                self.hits += 1
            else:
                missing.append(key)
                self.misses += 1
        return found, missing

    def keep(self, computed: dict[tuple[int, ...], DynamicCache]) -> None:
        for key, cache in computed.items():
            if len(key) <= self.budget:
                self._entries[key] = cache
        while sum(len(k) for k in self._entries) > self.budget:
            self._entries.popitem(last=False)

    def __contains__(self, state: Sequence[int]) -> bool:
        return tuple(state) in self._entries

    def clear(self) -> None:
        self._entries.clear()


def block_diagonal_mask(lengths: Sequence[int], dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
    """The additive mask and position ids that run several states side by side as if each were alone:
    causal within each state, nothing across."""
    n = sum(lengths)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    positions, start = [], 0
    for length in lengths:
        allowed[start : start + length, start : start + length] = torch.ones(length, length, dtype=torch.bool).tril()
        positions += range(length)
        start += length
    return torch.zeros((1, 1, n, n), dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min), positions


def cut(cache: DynamicCache, lengths: Sequence[int]) -> list[DynamicCache]:
    """A cache of states side by side, cut into one cache per state."""
    out, start = [], 0
    for length in lengths:
        out.append(
            DynamicCache(
                ddp_cache_data=[
                    (
                        layer.keys[:, :, start : start + length].clone(),
                        layer.values[:, :, start : start + length].clone(),
                    )
                    for layer in cache.layers
                ]
            )
        )
        start += length
    return out


def concat(caches: Sequence[DynamicCache]) -> DynamicCache:
    """Several states' keys/values side by side in one cache (their positions are their own)."""
    return DynamicCache(
        ddp_cache_data=[
            (
                torch.cat([c.layers[i].keys for c in caches], dim=2),
                torch.cat([c.layers[i].values for c in caches], dim=2),
            )
            for i in range(len(caches[0].layers))
        ]
    )
