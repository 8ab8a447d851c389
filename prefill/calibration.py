"""Calibration: temperatures fitted on labelled data, saved tied to the model, and applied when serving.

Temperature scaling divides each answer's log-likelihood by T before the softmax over declared answers.
It never changes which answer is most likely (accuracy is untouched) but moves every probability and so
every confidence. One temperature per question type, optionally per option-count bucket; a file is only
accepted by the model whose fingerprint it names, so a temperature fitted for one model is never applied
to another.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .metrics import Prediction

BUCKETS = ((2, 2), (3, 5), (6, 20), (21, 255))
T_MIN, T_MAX = 0.05, 20.0


def bucket(n_options: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= n_options <= hi:
            return f"{lo}-{hi}" if lo != hi else str(lo)
    return "other"


def rescale(p: Sequence[float], temperature: float) -> list[float]:
    """softmax(log p / T): the same as re-running the softmax on the log-likelihoods at temperature T."""
    logs = [math.log(max(x, 1e-300)) / temperature for x in p]
    top = max(logs)
    exps = [math.exp(v - top) for v in logs]
    total = sum(exps)
    return [e / total for e in exps]


def nll_at(preds: Sequence[Prediction], temperature: float) -> float:
    return -sum(math.log(max(rescale(p, temperature)[g], 1e-300)) for p, g in preds) / len(preds)


def fit_temperature(preds: Sequence[Prediction]) -> float:
    """The T minimising the log loss, by golden-section search on log T (the loss is unimodal in T)."""
    if not preds:
        return 1.0
    lo, hi = math.log(T_MIN), math.log(T_MAX)
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll_at(preds, math.exp(a)), nll_at(preds, math.exp(b))
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll_at(preds, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll_at(preds, math.exp(b))
    return round(math.exp((lo + hi) / 2), 4)


@dataclass
class Calibration:
    """Temperatures for one model: `by_type[type]`, refined by `by_bucket["type:bucket"]` where fitted."""
    model: str
    fingerprint: str
    by_type: dict[str, float] = field(default_factory=dict)
    by_bucket: dict[str, float] = field(default_factory=dict)
    notes: dict = field(default_factory=dict)

    def temperature(self, qtype: str, n_options: int) -> float:
        return self.by_bucket.get(f"{qtype}:{bucket(n_options)}", self.by_type.get(qtype, 1.0))

    @classmethod
    def fit(cls, model: str, fingerprint: str, preds_by_type: dict[str, list[Prediction]],
            buckets: bool = False, min_bucket: int = 30) -> Calibration:
        cal = cls(model, fingerprint)
        for qtype, preds in preds_by_type.items():
            cal.by_type[qtype] = fit_temperature(preds)
            if buckets:
                groups: dict[str, list[Prediction]] = {}
                for p, g in preds:
                    groups.setdefault(bucket(len(p)), []).append((p, g))
                for name, group in groups.items():
                    if len(group) >= min_bucket:
                        cal.by_bucket[f"{qtype}:{name}"] = fit_temperature(group)
        return cal

    def apply(self, qtype: str, p: Sequence[float]) -> list[float]:
        return rescale(p, self.temperature(qtype, len(p)))

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"model": self.model, "fingerprint": self.fingerprint,
                                          "temperatures": {"by_type": self.by_type, "by_bucket": self.by_bucket},
                                          "notes": self.notes}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None) -> Calibration:
        data = json.loads(Path(path).read_text())
        if fingerprint is not None and data["fingerprint"] != fingerprint:
            raise ValueError(f"{path} was fitted for model fingerprint {data['fingerprint'][:16]}…, "
                             f"not this model's {fingerprint[:16]}…")
        t = data["temperatures"]
        return cls(data["model"], data["fingerprint"], dict(t.get("by_type", {})), dict(t.get("by_bucket", {})),
                   data.get("notes", {}))


def shipped(fingerprint: str) -> Path | None:
    """A calibration shipped with prefill for this model (fitted by `prefill calibrate`), if any."""
    path = Path(__file__).parent / "calibrations" / f"{fingerprint[:16]}.json"
    return path if path.is_file() else None
