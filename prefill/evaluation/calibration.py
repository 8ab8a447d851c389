"""Calibration: temperatures fitted on labelled data, saved tied to the model, and applied when serving.

Temperature scaling divides each answer's log-likelihood by T before the softmax over declared answers.
It never changes which answer is most likely (accuracy is untouched) but moves every probability and so
every confidence. One temperature per question type, optionally per option-count bucket. Yes/no answers
also get a bias on "yes" (Platt scaling: P'(yes) = sigmoid(x / T + b), x the yes-minus-no log-likelihood),
because a small model's error there is mostly a lean towards one answer, which no temperature can undo;
on sys1bench it is what brings the held-out noul ECE under 0.05 (see README). A file is only accepted by the
model whose fingerprint it names, so temperatures fitted for one model are never applied to another.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .metrics import Prediction

BUCKETS = ((2, 2), (3, 5), (6, 20), (21, 255))
LEGACY_SETUP = {"prompt": "chat-yesno", "choice": "whole", "noul": "whole", "score": "whole"}
T_MIN, T_MAX = 0.05, 20.0


def bucket(n_options: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= n_options <= hi:
            return f"{lo}-{hi}" if lo != hi else str(lo)
    return "other"


def rescale(p: Sequence[float], temperature: float, bias: float = 0.0) -> list[float]:
    """softmax(log p / T), `bias` added to the first answer: the same as re-running the softmax on the
    log-likelihoods (they differ from log p by a constant)."""
    logs = [math.log(max(x, 1e-300)) / temperature for x in p]
    logs[0] += bias
    top = max(logs)
    exps = [math.exp(v - top) for v in logs]
    total = math.fsum(exps)  # exactly: the options' order cannot move a bit (engine.softmax)
    return [e / total for e in exps]


def gold_mass(p: Sequence[float], gold: int | Sequence[float]) -> float:
    """The probability of the gold answer; `gold` may also weigh several answers (a binary label on a
    graded question: "positive" is the levels above the middle, and half of the middle one)."""
    return p[gold] if isinstance(gold, int) else sum(w * x for w, x in zip(gold, p))


def nll_at(preds: Sequence[Prediction], temperature: float) -> float:
    return -sum(math.log(max(gold_mass(rescale(p, temperature), g), 1e-300)) for p, g in preds) / len(preds)


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


def fit_platt(preds: Sequence[Prediction]) -> tuple[float, float]:
    """(T, b) minimising the log loss of sigmoid(x / T + b) for two-answer questions, by Newton's method
    with a backtracking line search on the logistic regression of the gold answer on x = log p0 - log p1."""
    xs = [math.log(max(p[0], 1e-300)) - math.log(max(p[1], 1e-300)) for p, _ in preds]
    ys = [1.0 if g == 0 else 0.0 for _, g in preds]

    def loss(a: float, b: float) -> float:
        return sum(_softplus(a * x + b) - y * (a * x + b) for x, y in zip(xs, ys))

    a, b = 1.0, 0.0
    current = loss(a, b)
    for _ in range(100):
        g_a = g_b = h_aa = h_ab = h_bb = 0.0
        for x, y in zip(xs, ys):
            q = 1 / (1 + math.exp(-max(-60.0, min(60.0, a * x + b))))
            w = q * (1 - q)
            g_a, g_b = g_a + (q - y) * x, g_b + q - y
            h_aa, h_ab, h_bb = h_aa + w * x * x, h_ab + w * x, h_bb + w
        h_aa, h_bb = h_aa + 1e-6, h_bb + 1e-6
        det = h_aa * h_bb - h_ab * h_ab
        step_a, step_b = (h_bb * g_a - h_ab * g_b) / det, (h_aa * g_b - h_ab * g_a) / det
        scale = 1.0
        while scale > 1e-6:
            na = min(1 / T_MIN, max(1 / T_MAX, a - scale * step_a))
            nb = b - scale * step_b
            if (new := loss(na, nb)) <= current:
                break
            scale /= 2
        else:
            break
        moved = abs(na - a) + abs(nb - b)
        a, b, current = na, nb, new
        if moved < 1e-9:
            break
    return round(1 / a, 4), round(b, 4)


def _softplus(z: float) -> float:
    return z + math.log1p(math.exp(-z)) if z > 0 else math.log1p(math.exp(z))


@dataclass
class Calibration:
    """Temperatures for one model: `by_type[type]`, refined by `by_bucket["type:bucket"]` where fitted."""

    model: str
    fingerprint: str
    by_type: dict[str, float] = field(default_factory=dict)
    by_bucket: dict[str, float] = field(default_factory=dict)
    bias: dict[str, float] = field(default_factory=dict)  # added to the first answer's logit ("noul": yes)
    notes: dict = field(default_factory=dict)
    # The prompt and scoring the temperatures were fitted under (api.setup); files from before the scoring
    # choice existed were fitted under LEGACY_SETUP.
    setup: dict[str, str] = field(default_factory=dict)

    def fits(self, used: dict[str, str]) -> bool:
        """Whether these temperatures were fitted on scores made the way `used` makes them."""
        return (self.setup or LEGACY_SETUP) == used

    def temperature(self, qtype: str, n_options: int) -> float:
        return self.by_bucket.get(f"{qtype}:{bucket(n_options)}", self.by_type.get(qtype, 1.0))

    def adjust(self, qtype: str, loglik: Sequence[float]) -> list[float]:
        """The log-likelihoods as the softmax should see them: divided by T, the bias added."""
        t = self.temperature(qtype, len(loglik))
        out = [x / t for x in loglik]
        out[0] += self.bias.get(qtype, 0.0)
        return out

    @classmethod
    def fit(
        cls,
        model: str,
        fingerprint: str,
        preds_by_type: dict[str, list[Prediction]],
        buckets: bool = False,
        min_bucket: int = 30,
    ) -> Calibration:
        cal = cls(model, fingerprint)
        for qtype, preds in preds_by_type.items():
            if qtype == "noul":
                cal.by_type[qtype], cal.bias[qtype] = fit_platt(preds)
                continue
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
        return rescale(p, self.temperature(qtype, len(p)), self.bias.get(qtype, 0.0))

    def parameters(self) -> dict:
        return {"by_type": self.by_type, "by_bucket": self.by_bucket, "bias": self.bias}

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(
            json.dumps(
                {
                    "model": self.model,
                    "fingerprint": self.fingerprint,
                    "temperatures": {"by_type": self.by_type, "by_bucket": self.by_bucket},
                    "bias": self.bias,
                    "setup": self.setup,
                    "notes": self.notes,
                },
                indent=2,
                ensure_ascii=False,
            )
            + "\n"
        )

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None) -> Calibration:
        data = json.loads(Path(path).read_text())
        if fingerprint is not None and data["fingerprint"] != fingerprint:
            raise ValueError(
                f"{path} was fitted for model fingerprint {data['fingerprint'][:16]}…, "
                f"not this model's {fingerprint[:16]}…"
            )
        t = data["temperatures"]
        return cls(
            data["model"],
            data["fingerprint"],
            dict(t.get("by_type", {})),
            dict(t.get("by_bucket", {})),
            dict(data.get("bias", {})),
            data.get("notes", {}),
            dict(data.get("setup", {})),
        )


def shipped(fingerprint: str) -> Path | None:
    """A calibration shipped with prefill for this model (fitted by `prefill calibrate`), if any."""
    path = Path(__file__).parents[1] / "calibrations" / f"{fingerprint[:16]}.json"
    return path if path.is_file() else None
