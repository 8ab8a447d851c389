"""Scoring rules and calibration metrics, as pure functions over (probabilities, gold index) pairs.

Every metric takes a list of predictions; a prediction is the probability vector over a question's
declared answers and the index of the gold answer. Question types are reported separately because their
answers mean different things (a yes/no, a name, a level)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

from ..calibration import Prediction


def argmax(p: Sequence[float]) -> int:
    return max(range(len(p)), key=p.__getitem__)


def accuracy(preds: Sequence[Prediction]) -> float:
    return sum(argmax(p) == g for p, g in preds) / len(preds)


def log_loss(preds: Sequence[Prediction]) -> float:
    return -sum(math.log(max(p[g], 1e-12)) for p, g in preds) / len(preds)


def brier(preds: Sequence[Prediction]) -> float:
    """Multi-class Brier score: Σ_k (p_k − 1[k = gold])², averaged (0 is perfect, 2 the worst)."""
    return sum(sum((pk - (k == g)) ** 2 for k, pk in enumerate(p)) for p, g in preds) / len(preds)


def macro_f1(preds: Sequence[Prediction], labels: Sequence[Sequence[str]]) -> float:
    """F1 per gold label (by name, pooled across questions), averaged over labels that occur."""
    tp: dict[str, int] = defaultdict(int)
    fp: dict[str, int] = defaultdict(int)
    fn: dict[str, int] = defaultdict(int)
    for (p, g), names in zip(preds, labels):
        guess = names[argmax(p)]
        if guess == names[g]:
            tp[guess] += 1
        else:
            fp[guess] += 1
            fn[names[g]] += 1
    classes = set(tp) | set(fn)
    f1s = [2 * tp[c] / (2 * tp[c] + fp[c] + fn[c]) for c in classes]
    return sum(f1s) / len(f1s) if f1s else 0.0


def _require_probabilities(p: Sequence[float]) -> None:
    """A NaN would otherwise be skipped by the argmax and the bins, and a broken fit would read as a
    calibrated one (a diverged temperature fit once printed ECE 0.000 for every cell)."""
    if not all(-1e-6 <= x <= 1 + 1e-6 for x in p):  # False for NaN, so NaN is refused too; rounding passes
        raise ValueError(f"probabilities must be finite and in [0, 1], got {list(p)}")


def reliability(preds: Sequence[Prediction], bins: int = 10) -> list[dict]:
    """Top-label reliability: per equal-width confidence bin, its count, mean confidence and accuracy."""
    rows = [{"lo": i / bins, "hi": (i + 1) / bins, "n": 0, "confidence": 0.0, "accuracy": 0.0} for i in range(bins)]
    for p, g in preds:
        _require_probabilities(p)
        k = argmax(p)
        b = rows[min(bins - 1, int(p[k] * bins))]
        b["n"] += 1
        b["confidence"] += p[k]
        b["accuracy"] += k == g
    for b in rows:
        if b["n"]:
            b["confidence"] /= b["n"]
            b["accuracy"] /= b["n"]
    return rows


def ece(preds: Sequence[Prediction], bins: int = 10) -> float:
    """Expected calibration error of the top label: Σ_bins (n_b / N) |accuracy_b − confidence_b|."""
    n = len(preds)
    return sum(b["n"] / n * abs(b["accuracy"] - b["confidence"]) for b in reliability(preds, bins) if b["n"])


def ece_floor(preds: Sequence[Prediction], bins: int = 10, draws: int = 200, seed: int = 0) -> float:
    """The ECE a perfectly calibrated model would still show on this many questions: gold answers drawn
    from the predicted distributions themselves, ECE averaged over draws. An ECE near this is noise."""
    rng = random.Random(seed)
    total = 0.0
    for _ in range(draws):
        sampled = [(p, rng.choices(range(len(p)), weights=p)[0]) for p, _ in preds]
        total += ece(sampled, bins)
    return total / draws


def ranked_probability_score(preds: Sequence[Prediction]) -> float:
    """For ordered levels: Σ_k (CDF_pred(k) − CDF_gold(k))² / (n − 1), averaged (0 is perfect); one level
    off costs less than three."""
    total = 0.0
    for p, g in preds:
        cum, score = 0.0, 0.0
        for k in range(len(p) - 1):
            cum += p[k]
            score += (cum - (1.0 if k >= g else 0.0)) ** 2
        total += score / (len(p) - 1)
    return total / len(preds)


def mean_absolute_error(preds: Sequence[Prediction]) -> float:
    """|expected level − gold level|, averaged."""
    return sum(abs(sum(i * x for i, x in enumerate(p)) - g) for p, g in preds) / len(preds)


def auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random negative (ties
    count half). 0.5 is no signal; under 0.5 the scores rank the classes backwards."""
    ranked = sorted(zip(scores, positive))
    n_pos = sum(positive)
    n_neg = len(ranked) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum, i = 0.0, 0
    while i < len(ranked):  # average ranks over ties
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        rank_sum += sum(pos for _, pos in ranked[i:j]) * (i + j + 1) / 2
        i = j
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def summary(preds: Sequence[Prediction], labels: Sequence[Sequence[str]], ordinal: bool) -> dict:
    out = {
        "n": len(preds),
        "accuracy": accuracy(preds),
        "macro_f1": macro_f1(preds, labels),
        "log_loss": log_loss(preds),
        "brier": brier(preds),
        "ece": ece(preds),
        "ece_floor": ece_floor(preds),
    }
    if ordinal:
        out["rps"] = ranked_probability_score(preds)
        out["mae"] = mean_absolute_error(preds)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
