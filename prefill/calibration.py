"""Calibration: temperatures fitted on labelled data, saved tied to the model, and applied when serving.

Temperature scaling divides each answer's log-likelihood by T before the softmax over declared answers.
It never changes which answer is most likely (accuracy is untouched) but moves every probability and so
every confidence. One temperature per question type, optionally per option-count bucket. Yes/no answers
also get a bias on "yes" (Platt scaling: P'(yes) = sigmoid(x / T + b), x the yes-minus-no log-likelihood),
because a small model's error there is mostly a lean towards one answer, which no temperature can undo;
on sys1bench it is what brings the held-out noul ECE under 0.05 (docs/measurements/real-text.md). A file is only
accepted by the model whose fingerprint it names, so temperatures fitted for one model are never applied to another.

Per question (`prefill calibrate --per-question`): a question asked often enough in the labelled rows gets its
own correction on top of its type's calibration (a temperature and a bias per answer), found again by the
question's content (never its id, nor its options' order), so one question's lean is undone without moving any
other. Why: on real tasks each question leans its own way ("Is this review negative?" is answered yes to most
positive reviews, "... positive?" is not), which one bias per type cannot undo for both. Measured on the real-task
suite's nine tasks, 21 task x type cells, one calibration file for all of them fitted on half of each task's
texts and measured on the other half (`benchmarks.quality.tasks --report`, docs/measurements/calibration.md): mean
accuracy 0.716 -> 0.743, ECE 0.123 -> 0.077 (at most 0.05 on 7 cells instead of 2), log loss 0.581 -> 0.539. A
file of one task's rows gains nothing (0.730 / 0.080 both ways): one yes-bias fits a task's lean about as well.
It loses where a question carries no signal (spam e-mail: the correction fits noise in 24 rows).
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import loading
from .schema import AnyQuestion

Prediction = tuple[Sequence[float], int]  # (probabilities over declared answers, gold index)


BUCKETS = ((2, 2), (3, 5), (6, 20), (21, 255))
LEGACY_SETUP = {"prompt": "chat-yesno", "choice": "whole", "noul": "whole", "score": "whole"}
T_MIN, T_MAX = 0.05, 20.0
# A question needs this many labelled rows for a calibration of its own, and its correction (the biases and
# log(1 / T_q)) is shrunk by this L2 weight. On the suite as above (24 rows a question, one file): the biases
# alone shrunk by 1, 3, 10, 30 gave mean accuracy 0.732, 0.732, 0.731, 0.726 and ECE 0.085, 0.076, 0.071, 0.073
# (10 loses the routing gains: six mailing lists 0.626 -> 0.576); shrinking log(1 / T_q) too, by 1, 3, 10: 0.739,
# 0.743, 0.742, ECE 0.078, 0.077, 0.086, log loss 0.537, 0.539, 0.544 (0.550 without). So 3 for both. Keeping
# a question's own only where a 2-fold split of its rows favours it did worse (0.729 / 0.094).
MIN_QUESTION_ROWS = 20
BIAS_L2 = 3.0


def question_key(q: AnyQuestion) -> str:
    """What a question's own calibration is found by: its type, wording and answers (a choice's options in
    any order, with their descriptions), never its id."""
    canonical = json.dumps(q.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)  # sorts the options
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


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
    return _normalised(logs)


def _normalised(logs: Sequence[float]) -> list[float]:
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


def fit_question(
    preds: Sequence[Prediction], l2: float = BIAS_L2, t_min: float = T_MIN, t_max: float = T_MAX
) -> tuple[float, list[float]]:
    """(T, a bias per answer) minimising the log loss of softmax(log p / T + b) plus l2 * (|b|^2 + log(1/T)^2),
    by L-BFGS: one question's own correction. The penalty keeps it near none (T = 1, b = 0) where the rows are
    few, and centres the biases (a constant added to every answer changes nothing)."""
    import torch

    x = torch.tensor([[math.log(max(v, 1e-300)) for v in p] for p, _ in preds], dtype=torch.float64)
    gold = torch.tensor([g for _, g in preds])
    log_a = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_a, b], max_iter=200, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        a = log_a.exp().clamp(1 / t_max, 1 / t_min)
        penalty = l2 * ((b**2).sum() + (log_a**2).sum())
        value = torch.nn.functional.cross_entropy(x * a + b, gold, reduction="sum") + penalty
        value.backward()
        return value

    opt.step(loss)
    a = min(1 / t_min, max(1 / t_max, math.exp(log_a.item())))
    return 1 / a, b.tolist()


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
    # question_key -> {"temperature": T, "bias": {answer name: b}}: one question's own, used instead of its type's
    by_question: dict[str, dict] = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    # The prompt and scoring the temperatures were fitted under (api.setup); files from before the scoring
    # choice existed were fitted under LEGACY_SETUP.
    setup: dict[str, str] = field(default_factory=dict)

    def fits(self, used: dict[str, str]) -> bool:
        """Whether these temperatures were fitted on scores made the way `used` makes them."""
        return (self.setup or LEGACY_SETUP) == used

    def temperature(self, qtype: str, n_options: int) -> float:
        return self.by_bucket.get(f"{qtype}:{bucket(n_options)}", self.by_type.get(qtype, 1.0))

    def adjust(
        self, qtype: str, loglik: Sequence[float], key: str | None = None, labels: Sequence[str] = ()
    ) -> list[float]:
        """The log-likelihoods as the softmax should see them: divided by T, the bias added; with the
        question's own T and biases (by answer name, `labels` in the order of `loglik`) where it has them."""
        own = self.by_question.get(key) if key else None
        if own is not None:
            return [x / own["temperature"] + own["bias"].get(name, 0.0) for x, name in zip(loglik, labels)]
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
        by_question: dict[str, tuple[str, list[str], list[Prediction]]] | None = None,
    ) -> Calibration:
        """Per type (and bucket); with `by_question` (key -> (type, answer names, that question's rows)), each
        question with at least MIN_QUESTION_ROWS rows also gets its own correction on top (`own`)."""
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
        for key, (qtype, labels, preds) in (by_question or {}).items():
            if len(preds) >= MIN_QUESTION_ROWS:
                cal.by_question[key] = cal.own(qtype, labels, preds)
        return cal

    def own(self, qtype: str, labels: list[str], preds: list[Prediction]) -> dict:
        """One question's temperature and bias per answer: its type's calibration, then a correction fitted
        on its own rows (fit_question, shrunk towards none, so few rows leave the type's), the two folded
        into one (T = T_type * T_q; the type's yes-bias divided by T_q)."""
        t_type, b_type = self.temperature(qtype, len(labels)), self.bias.get(qtype, 0.0)
        scaled = [(rescale(p, t_type, b_type), g) for p, g in preds]
        t_q, b_q = fit_question(scaled, t_min=T_MIN / t_type, t_max=T_MAX / t_type)  # T_type * T_q within bounds
        b_q[0] += b_type / t_q
        return {"temperature": round(t_type * t_q, 4), "bias": dict(zip(labels, (round(b, 4) for b in b_q)))}

    def apply(self, qtype: str, p: Sequence[float], key: str | None = None, labels: Sequence[str] = ()) -> list[float]:
        """`adjust` on probabilities (log p differs from the log-likelihoods by a constant), normalised."""
        return _normalised(self.adjust(qtype, [math.log(max(x, 1e-300)) for x in p], key, labels))

    def parameters(self) -> dict:
        return {
            "by_type": self.by_type,
            "by_bucket": self.by_bucket,
            "bias": self.bias,
            "by_question": self.by_question,
        }

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(
            json.dumps(
                {
                    "model": self.model,
                    "fingerprint": self.fingerprint,
                    "temperatures": {"by_type": self.by_type, "by_bucket": self.by_bucket},
                    "bias": self.bias,
                    "by_question": self.by_question,
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
            dict(data.get("by_question", {})),
            data.get("notes", {}),
            dict(data.get("setup", {})),
        )


def shipped(fingerprint: str) -> Path | None:
    """A calibration shipped with prefill for this model (fitted by `prefill calibrate`), if any."""
    path = Path(__file__).parent / "calibrations" / f"{fingerprint[:16]}.json"
    return path if path.is_file() else None


def setup(renderer, scoring: Mapping[str, Any]) -> dict[str, str]:
    """What a calibration's temperatures depend on besides the weights: the prompt and the scoring."""
    return {
        "prompt": f"{'chat' if renderer.chat else 'plain'}{'' if renderer.system else '-nosystem'}"
        f"-{renderer.noul_words}{'-levelnames' if renderer.score_words == 'names' else ''}"
        f"{'-numberedoptions' if renderer.choice_words == 'numbers' else ''}",
        **{t: str(w) for t, w in sorted(scoring.items())},
    }


def check_calibration(choice: str | Path | None) -> None:
    """A calibration file that is not there, said before anything loads."""
    if choice not in (None, "auto") and not Path(choice).is_file():
        raise ValueError(f"calibration {choice}: no such file (a file prefill calibrate wrote, auto or none)")


def find_calibration(
    choice: str | Path | None, fingerprint: str, used: dict[str, str] | None = None
) -> Calibration | None:
    """`used`: this engine's setup(); a calibration fitted under another one is skipped ("auto": the
    temperatures would be wrong for these scores) or refused (a file the caller named)."""
    if choice is None:
        return None
    if choice == "auto":
        cached = loading.cache_dir() / "calibration" / f"{fingerprint[:16]}.json"
        path = cached if cached.is_file() else shipped(fingerprint)
        cal = Calibration.load(path, fingerprint) if path else None
        if cal is not None and used is not None and not cal.fits(used):
            fitted = cal.setup or "the whole-sequence readout of earlier versions"
            warnings.warn(
                f"not applying {path}: it was fitted with {fitted}, not this engine's {used}; "
                "refit it with `prefill calibrate`",
                stacklevel=2,
            )
            return None
        return cal
    check_calibration(choice)
    cal = Calibration.load(choice, fingerprint)
    if used is not None and not cal.fits(used):
        raise ValueError(f"{choice} was fitted with {cal.setup}, not this engine's {used}")
    return cal
