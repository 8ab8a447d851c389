"""Fitting one readout head on cached features: the examples (hidden states from the engine's own packed
pass, computed once), batches, training with weight decay and epochs chosen on held-out data (`choose`: leave
one family out for several families, 5-fold over items for one task), predictions and temperatures. What
`prefill train` does with them, and the early-exit head: training.py; the loss: objective.py.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from tqdm import tqdm

from ..calibration import fit_temperature, rescale
from ..evaluation.evaluate import Item, gold_index
from ..heads import TYPES, Head, HeadConfig, answer_key
from ..schema import answer_labels
from .objective import Batch, masked_log_softmax, mixed_target, objective


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


def keys(e: Example) -> list[str]:
    return [answer_key(e.qtype, label) for label in e.labels]


def taught(examples: Sequence[Example]) -> list[str]:
    """The answers a classes head learns a weight vector for: those its training examples declare."""
    return sorted({k for e in examples for k in keys(e)})


def target(e: Example, label_weight: float) -> torch.Tensor:
    return mixed_target(len(e.labels), e.gold, e.teacher, label_weight)


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
        [keys(e) for e in examples],
    )
    for i, e in enumerate(examples):
        k = len(e.labels)
        b.options[i, :k] = e.options[:, layer]
        b.loglik[i, :k] = e.loglik
        b.mask[i, :k] = True
        b.target[i, :k] = target(e, label_weight)
    return b


def fit_temperatures(head: Head, out_of_family: Sequence[tuple[list[float], str, int]]) -> dict:
    """A temperature per question type (when it has ≥ 20 questions) from (probabilities, type, gold) of
    questions whose family the head did not train on."""
    for i, qtype in enumerate(TYPES):
        preds = [(p, g) for p, t, g in out_of_family if t == qtype]
        if len(preds) >= 20:
            head.temperature[i] = fit_temperature(preds)
    return {t: round(x, 4) for t, x in zip(TYPES, head.temperature.tolist())}


def train_head(
    examples: Sequence[Example],
    cfg: HeadConfig,
    layer: int,
    *,
    rl_weight: float = 0.0,
    label_weight: float = 0.5,
    epochs: int = 400,
    weight_decay: float = 0.1,
    seed: int = 0,
) -> tuple[Head, dict]:
    """Full-batch AdamW on the cached features for `epochs` epochs (`choose` picks them). Weight decay pulls
    the head towards zero, that is towards the training-free answer (α, the weight of the log-likelihood, is
    not decayed). A classes head (without the RLCD term) is a convex problem and is solved instead
    (`_solve_classes`)."""
    if solved(cfg, rl_weight):
        return _solve_classes(_new_head(examples, cfg, seed), examples, layer, label_weight, weight_decay, ())
    head, step = _trainer(examples, cfg, layer, rl_weight, label_weight, weight_decay, seed)
    for _ in range(epochs):
        step()
    return head.eval(), {"epochs_kept": epochs}


def _trainer(
    examples: Sequence[Example],
    cfg: HeadConfig,
    layer: int,
    rl_weight: float,
    label_weight: float,
    weight_decay: float,
    seed: int,
    lr: float = 1e-2,
    group: int = 8,
    sigma: float = 1.0,
):
    """A fresh head and a function that trains it one full-batch AdamW epoch."""
    head = _new_head(examples, cfg, seed)
    weights = [p for n, p in head.named_parameters() if p.requires_grad and n != "alpha"]
    groups = [{"params": weights, "weight_decay": weight_decay}]
    if cfg.use_base:
        groups.append({"params": [head.alpha], "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=lr)
    b = batch(examples, layer, label_weight)

    def step() -> None:
        head.train()
        loss = objective(head(b.qtype, b.decision, b.options, b.loglik, b.answers), b, rl_weight, group, sigma)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return head, step


def _new_head(examples: Sequence[Example], cfg: HeadConfig, seed: int) -> Head:
    """The same initial head for the same seed; a classes head gets the answers `examples` teach."""
    torch.manual_seed(seed)
    return Head(replace(cfg, answers=taught(examples)) if cfg.kind == "classes" else cfg)


def _fit_folds(
    folds: Sequence[tuple[list, list]],
    cfg: HeadConfig,
    layer: int,
    *,
    rl_weight: float,
    label_weight: float,
    weight_decay: float,
    epochs: int = 400,
    patience: int = 50,
    check: int = 5,
) -> tuple[list[Head], float, int]:
    """One head a fold, trained side by side and stopped together: the epochs kept are the ones with the
    lowest held-out log loss over all folds (checked every `check` epochs; training stops `patience` epochs
    after it), one number for every fold, as the final head is trained for. Stopping each fold at its own
    best epoch would read the loss at a minimum chosen on the very rows it measures: an optimistic held-out
    loss, which `--kind auto` would compare with a solved classes head's honest one (measured:
    docs/measurements/distillation.md#every-fold-read-at-the-same-epochs). A solved head: each fold's solved, the
    held-out loss over all."""
    held = sum(len(val) for _, val in folds)
    if solved(cfg, rl_weight):
        solved_runs = [_solve_classes(_new_head(f, cfg, 0), f, layer, label_weight, weight_decay, v) for f, v in folds]
        loss = sum(log["validation_log_loss"] * len(v) for (_, log), (_, v) in zip(solved_runs, folds)) / held
        iterations = round(sum(log["epochs_kept"] for _, log in solved_runs) / len(folds))
        return [head for head, _ in solved_runs], loss, iterations
    runs = [_trainer(fit, cfg, layer, rl_weight, label_weight, weight_decay, seed=0) for fit, _ in folds]
    vals = [(batch(val, layer, held_out_weight(label_weight)), len(val)) for _, val in folds]
    best = (math.inf, None, 0)
    for epoch in range(1, epochs + 1):
        for _, step in runs:
            step()
        if epoch % check and epoch != epochs:
            continue
        loss = sum(_validation_loss(head.eval(), v) * n for (head, _), (v, n) in zip(runs, vals)) / held
        if loss < best[0]:
            best = (loss, [{k: t.clone() for k, t in head.state_dict().items()} for head, _ in runs], epoch)
        elif epoch - best[2] >= patience:
            break
    if best[1] is None:  # no finite loss at any check: the heads as trained
        return [head.eval() for head, _ in runs], best[0], epochs
    for (head, _), state in zip(runs, best[1]):
        head.load_state_dict(state)
    return [head.eval() for head, _ in runs], best[0], best[2]


def _solve_classes(
    head: Head,
    examples: Sequence[Example],
    layer: int,
    label_weight: float,
    penalty: float,
    validation: Sequence[Example],
    max_iter: int = 500,
) -> tuple[Head, dict]:
    """A classes head is a softmax regression on the (normalised) decision state, plus α · the training-free
    score: its loss with an L2 penalty on the weight vectors is convex, so L-BFGS solves it to the optimum,
    where AdamW with decoupled decay and early stopping stopped short of it. Measured on the distillation
    tasks' teacher journals (docs/measurements/distillation.md#the-classes-head-solved-not-trained; students trained
    anew on the same rows): the held-out log loss against the teacher fell on all three tasks with a classes head, and
    the agreement with it rose on both routing sets (0.779 -> 0.818, 0.760 -> 0.771) and held on language."""
    b = batch(examples, layer, label_weight)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, max_iter=max_iter, tolerance_change=1e-9, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = objective(head(b.qtype, b.decision, b.options, b.loglik, b.answers), b)
        loss = loss + penalty * (head.table**2).sum()  # the weight vectors; the bias and α go free
        loss.backward()
        return loss

    head.train()
    opt.step(closure)
    head.eval()
    iterations = opt.state[params[0]].get("n_iter", max_iter)
    loss = _validation_loss(head, batch(validation, layer, held_out_weight(label_weight))) if validation else math.inf
    return head, {"epochs_kept": iterations, "validation_log_loss": loss}


def solved(cfg: HeadConfig, rl_weight: float) -> bool:
    """Whether the head is solved (`_solve_classes`) rather than trained: a classes head without the RLCD term."""
    return cfg.kind == "classes" and not rl_weight


def held_out_weight(label_weight: float) -> float:
    """What model selection scores a held-out question against: its gold label wherever training reads gold
    at all, and the teacher's distribution where training reads the teacher alone (`label_weight` 0:
    distillation, where the "gold" is only the teacher's top answer). Scoring a head trained on the teacher's
    distribution against its top answer chose for a target it does not learn. Measured on four distillation
    tasks (docs/measurements/distillation.md#model-selection-against-the-teachers-distribution): agreement with the
    teacher on held-out rows 0.828 -> 0.922 (French reviews, now a classes head) and 0.771 -> 0.844 (mailing lists),
    the other two held or rose; `prefill train` on gold labels is unchanged."""
    return 1.0 if label_weight > 0 else 0.0


def _validation_loss(head: Head, v) -> float:
    """The head's log loss on a validation batch (against its target: `held_out_weight`)."""
    with torch.no_grad():
        return float(objective(head(v.qtype, v.decision, v.options, v.loglik, v.answers), v))


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


WEIGHT_DECAYS = (0.01, 0.1, 1.0, 10.0, 100.0)
# A classes head's L2 penalties (on the mean loss; `_solve_classes`), chosen on held-out data like the above.
CLASSES_PENALTIES = (1e-4, 1e-3, 1e-2, 3e-2, 1e-1)


def choose(
    examples: Sequence[Example],
    cfg: HeadConfig,
    layer: int,
    *,
    rl_weight: float,
    label_weight: float,
    grid: Sequence[float] | None = None,
    progress: str | None = None,
) -> tuple[dict, list]:
    """Weight decay and epochs chosen on held-out data (`folds_of`). Also returns the chosen setting's
    out-of-fold (probabilities, example) pairs: every example scored by a head that did not train on it.
    The grid: `CLASSES_PENALTIES` for a solved head, `WEIGHT_DECAYS` for a trained one, unless given."""
    grid = grid or (CLASSES_PENALTIES if solved(cfg, rl_weight) else WEIGHT_DECAYS)
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
        heads, loss, epochs = _fit_folds(
            folds, cfg, layer, rl_weight=rl_weight, label_weight=label_weight, weight_decay=wd
        )
        bar.update(len(folds))
        results.append({"weight_decay": wd, "epochs": epochs, "held_out_log_loss": round(loss, 4)})
        out_of_fold[wd] = [pair for head, (_, val) in zip(heads, folds) for pair in zip(predict(head, val, layer), val)]
    bar.close()
    best = min(results, key=lambda r: r["held_out_log_loss"])
    return best | {"held_out": how, "grid": results}, out_of_fold[best["weight_decay"]]


def fit_head(
    examples: Sequence[Example],
    cfg: HeadConfig,
    layer: int,
    *,
    rl_weight: float,
    label_weight: float,
    seed: int = 0,
    progress: str | None = None,
) -> tuple[Head, dict, list]:
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


def predict(head: Head, examples: Sequence[Example], layer: int) -> list[list[float]]:
    if not examples:
        return []
    b = batch(examples, layer, 1.0)
    with torch.no_grad():
        p = masked_log_softmax(head(b.qtype, b.decision, b.options, b.loglik, b.answers), b.mask).exp()
    return [p[i, : len(e.labels)].tolist() for i, e in enumerate(examples)]
