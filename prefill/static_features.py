"""How the static student reads a text (prefill/static.py says what it is): its meaning and its form, for many texts
at once, each row with the arithmetic it would have alone. numpy and the tokenizer only.

- **meaning**: the sum of the tokens' rows of a static embedding table, L2-normalised;
- **form**: the tokens, pairs of neighbouring tokens and three-byte pieces of the lowercased UTF-8 text, hashed
  into HASH_BUCKETS counts, L2-normalised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

HASH_BUCKETS = 1 << 15


@dataclass
class Features:
    """Texts' features, a row a text. A row's numbers are the same bits whatever rows are read with it: its
    meaning is summed from its own table rows alone, its form's counts are integers, and every later reduction
    (the norms, the heads' products) runs over one row's own numbers in one order (a row's last axis,
    `np.add.reduceat`'s segments)."""

    meaning: np.ndarray  # (rows, dims) float32: the sum of the tokens' table rows, L2-normalised
    starts: np.ndarray  # (rows + 1,) int64: row i's form is buckets[starts[i]:starts[i + 1]], values likewise
    buckets: np.ndarray  # (pieces,) int64, ascending within a row
    values: np.ndarray  # (pieces,) float32: the row's counts, L2-normalised
    tokens: np.ndarray  # (rows,) int64

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, rows: Sequence[int]) -> Features:
        """The rows named, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        lengths = np.diff(self.starts)[rows]
        starts = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        picked = np.arange(starts[-1]) + np.repeat(self.starts[rows] - starts[:-1], lengths)
        return Features(self.meaning[rows], starts, self.buckets[picked], self.values[picked], self.tokens[rows])

    def dense(self) -> np.ndarray:
        """(rows, dims + HASH_BUCKETS) float32: the rows as training reads them."""
        rows, dims = self.meaning.shape
        out = np.zeros((rows, dims + HASH_BUCKETS), dtype=np.float32)
        out[:, :dims] = self.meaning
        out[np.repeat(np.arange(rows), np.diff(self.starts)), dims + self.buckets] = self.values
        return out


def read(tokenizer, table: np.ndarray, texts: Sequence[str], rows_at_once: int = 64) -> Features:
    """Each text's meaning, form and token count (`StaticStudent.features`; training reads them the same way).
    The form is found `rows_at_once` texts at a time: its arrays then stay in the core's cache (2x faster than
    2,048 texts at once, measured on the packages task's texts)."""
    encodings = tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
    tokens = np.array([len(e.ids) for e in encodings], dtype=np.int64)
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=int(tokens.sum()))
    ends = np.cumsum(tokens)
    spans = [(i, min(i + rows_at_once, len(texts))) for i in range(0, len(texts), rows_at_once)]
    forms = [form(ids[ends[i] - tokens[i] : ends[j - 1]], tokens[i:j], texts[i:j]) for i, j in spans]
    starts, buckets, values = joined(forms)
    return Features(meaning(table, ids, tokens), starts, buckets, values, tokens)


def joined(forms: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Consecutive rows' forms (`form`'s starts, buckets, values) as one."""
    offsets = np.cumsum([0] + [int(starts[-1]) for starts, _, _ in forms])
    starts = np.concatenate([np.zeros(1, dtype=np.int64)] + [f[0][1:] + o for f, o in zip(forms, offsets)])
    pieces = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.float32)]
    return starts, np.concatenate(pieces[0] + [f[1] for f in forms]), np.concatenate(pieces[1] + [f[2] for f in forms])


def meaning(table: np.ndarray, ids: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(rows, dims): each row's tokens' table rows summed, L2-normalised (zeros for a row with none). A row at a
    time: its rows of the table (about 90 KB for a 400-character text) stay in the core's cache, where one
    `np.add.reduceat` over a batch's was 5x slower (measured on the packages task's texts)."""
    sums = np.zeros((len(tokens), table.shape[1]), dtype=np.float32)
    ends = np.cumsum(tokens).tolist()
    for row, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
        if end > start:
            np.add.reduce(table.take(ids[start:end], axis=0), axis=0, out=sums[row])
    norms = np.sqrt((sums * sums).sum(axis=1, keepdims=True))
    return sums / np.where(norms > 0, norms, 1)


def form(ids: np.ndarray, tokens: np.ndarray, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's hashed bag of tokens, token pairs and byte trigrams of its lowercased UTF-8 text, none across
    two rows: (starts, buckets, L2-normalised counts) as `Features` holds them. The pieces are put row by row
    (a radix sort on the row), then each row's buckets sorted on their own (16-bit: a radix sort again), where
    one sort of a batch's (row, bucket) keys took 4x as long."""
    rows = len(tokens)
    raw_texts = [t.lower().encode("utf-8") for t in texts]
    raw = np.frombuffer(b"".join(raw_texts), dtype=np.uint8).astype(np.int64)
    token_row = np.repeat(np.arange(rows), tokens)
    byte_row = np.repeat(np.arange(rows), [len(t) for t in raw_texts])
    pairs = token_row[:-1] == token_row[1:]
    trigrams = byte_row[:-2] == byte_row[2:]
    mixed = np.concatenate([
        ids * 0x9E3779B1 + 1,
        (ids[:-1] * 0x85EBCA77 + ids[1:] * 0xC2B2AE3D + 2)[pairs],
        (raw[:-2] * 0x27D4EB2F + raw[1:-1] * 0x165667B1 + raw[2:] * 0xD3A2646C + 3)[trigrams],
    ])  # fmt: skip
    row = np.concatenate([token_row, token_row[:-1][pairs], byte_row[:-2][trigrams]])
    order = np.argsort(row.astype(np.uint16) if rows <= 1 << 16 else row, kind="stable")
    row, hashed = row[order], ((mixed ^ (mixed >> 15)) % HASH_BUCKETS).astype(np.uint16)[order]
    starts = np.searchsorted(row, np.arange(rows + 1))
    for start, end in zip(starts[:-1].tolist(), starts[1:].tolist()):
        hashed[start:end].sort(kind="stable")
    first = np.ones(len(hashed), dtype=bool)
    first[1:] = (hashed[1:] != hashed[:-1]) | (row[1:] != row[:-1])
    at = np.flatnonzero(first)
    counts = np.diff(np.append(at, len(hashed)))
    row = row[at]
    norms = np.sqrt(np.bincount(row, weights=counts.astype(np.float64) ** 2, minlength=rows))
    starts = np.searchsorted(row, np.arange(rows + 1))
    return starts, hashed[at].astype(np.int64), (counts / norms[row]).astype(np.float32)
