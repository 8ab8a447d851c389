"""LoRA on the base, the heavier readout: low-rank updates to the top decoder layers, trained with the head.

Where the heads of head.py move only a read-out of frozen hidden states, a LoRA (rank r updates
W + (α/r)·B·A to every attention and MLP projection) changes what the model computes. It goes on the TOP
`top_layers` layers only, for a reason of cost: layers 1..k below stay frozen, so their output for every
training question is computed once (`CausalLMBackend.layer_inputs`, the served packed pass cut at layer k)
and each step runs layers k+1..L alone, state and question tree together so that gradients reach the
state's keys and values too (`forward_from`). With the default 8 of 30 layers that is about a quarter of
a forward (and its backward) per step, which is what makes it trainable on two CPU cores.

The loss is objective.objective (soft cross-entropy to the teacher/label mix, optionally + the RLCD term) on
the scores of a linear head over the last layer plus α · log-likelihood, both trained together with the
LoRA. Epochs are chosen on a family left out of training (so that what is kept is what carries over to
families never seen), and the per-type temperatures are fitted on that family's predictions.

Served, the adapter (peft's format, in the readout folder's `lora/`) is merged into the weights
(`CausalLMBackend.merge_adapter`): the same packed pass over updated weights, so packing, isolation and
the invariances are unchanged, and a question costs what it cost before.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..evaluation.evaluate import Item, gold_index
from ..heads import TYPES, Head, HeadConfig
from . import fitting
from . import train as training
from .fitting import fit_temperatures
from .objective import Batch, mixed_target, objective
from .train import question_key

# Every linear projection of a Llama/Qwen2/Mistral-style decoder layer.
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Unit:
    """One chunk of one item's questions: the layer-k inputs of its packed pass, and per question the
    fixed parts of a training batch (type, answer mask, target)."""

    item: int
    family: str
    inputs: object  # backends.hidden.TreeInputs
    qtypes: list[str]
    gold: list[int]
    teacher: list[torch.Tensor | None]

    def batch(self, loglik, decision, options, label_weight: float) -> Batch:
        n = max(len(t) for t in self.targets(label_weight))
        mask = torch.zeros(len(self.gold), n, dtype=torch.bool)
        target = torch.zeros(len(self.gold), n)
        for i, t in enumerate(self.targets(label_weight)):
            mask[i, : len(t)] = True
            target[i, : len(t)] = t
        return Batch(
            torch.tensor([TYPES.index(t) for t in self.qtypes]),
            decision,
            options,
            loglik,
            mask,
            target,
            torch.tensor([t == "score" for t in self.qtypes]),
        )

    def targets(self, label_weight: float) -> list[torch.Tensor]:
        sizes = self.inputs.tree.n_answers
        return [mixed_target(n, g, t, label_weight) for n, g, t in zip(sizes, self.gold, self.teacher)]


def extract(backend, items: Sequence[Item], layer: int, teacher: dict[str, list[float]] | None = None) -> list[Unit]:
    """Each item's packed pass through the frozen layers 1..`layer`, once."""
    out = []
    for i, item in enumerate(items):
        qids = list(item.questions)
        branches = [backend.renderer.question(item.questions[q]) for q in qids]
        start = 0
        for inputs in backend.layer_inputs(backend.renderer.state(item.state), branches, layer):
            chunk = [item.questions[q] for q in qids[start : start + len(inputs.tree.n_answers)]]
            chunk_ids = qids[start : start + len(chunk)]
            start += len(chunk)
            found = [teacher.get(question_key(item.state, q)) if teacher else None for q in chunk]
            out.append(
                Unit(
                    i,
                    item.family,
                    inputs,
                    [q.type for q in chunk],
                    [gold_index(q, item.gold[qid]) for q, qid in zip(chunk, chunk_ids)],
                    [torch.tensor(t, dtype=torch.float32) if t is not None else None for t in found],
                )
            )
    return out


def labels(units: Sequence[Unit]) -> list[tuple[str, int, int]]:
    """(type, gold, number of answers) per question, in `predict`'s order."""
    return [(t, g, n) for u in units for t, g, n in zip(u.qtypes, u.gold, u.inputs.tree.n_answers)]


def attach(backend, top_layers: int, rank: int):
    """LoRA modules (B = 0, so the model is unchanged until trained) on the top `top_layers` layers."""
    from peft import LoraConfig, get_peft_model

    from ..backends import weights

    weights.restore(backend.model)  # training reads the plain weights, which serving released
    depth = backend.depth
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=TARGET_MODULES,
        layers_to_transform=list(range(depth - top_layers, depth)),
    )
    return get_peft_model(backend.model, config)


def scores(backend, head: Head, unit: Unit) -> tuple[torch.Tensor, tuple]:
    loglik, decision, options = backend.forward_from(unit.inputs)
    qtype = torch.tensor([TYPES.index(t) for t in unit.qtypes])
    return head(qtype, decision, options, loglik.clamp(min=-1e4)), (loglik, decision, options)


def predict(backend, head: Head, units: Sequence[Unit]) -> list[list[float]]:
    """Probabilities per question over its declared answers, in unit order."""
    out = []
    with torch.no_grad():
        for u in units:
            s, _ = scores(backend, head, u)
            out += [torch.softmax(s[i, :n], dim=-1).tolist() for i, n in enumerate(u.inputs.tree.n_answers)]
    return out


def validation_loss(backend, head: Head, units: Sequence[Unit]) -> float:
    """Log loss against the gold answers."""
    preds = predict(backend, head, units)
    return -sum(math.log(max(p[g], 1e-12)) for p, (_, g, _) in zip(preds, labels(units))) / max(len(preds), 1)


def train(
    backend,
    fit: Sequence[Unit],
    validation: Sequence[Unit],
    *,
    top_layers: int,
    rank: int = 8,
    epochs: int = 4,
    lr: float = 2e-4,
    head_lr: float = 1e-3,
    label_weight: float = 0.5,
    rl_weight: float = 0.0,
    seed: int = 0,
    model: str = "",
    fingerprint: str = "",
):
    """AdamW, one step per unit (an item's chunk), in a shuffled order each epoch; the epoch with the
    lowest log loss on `validation` (a family left out) is kept, and the head's temperatures are fitted
    there. Returns the peft model (the backend's model with the adapter attached: `unload()` removes it),
    the head, and a log."""
    torch.manual_seed(seed)
    depth = backend.depth
    if fit and fit[0].inputs.layer != depth - top_layers:
        raise ValueError(
            f"the units were cut at layer {fit[0].inputs.layer}; a LoRA on the top {top_layers} "
            f"layers needs them cut at layer {depth - top_layers}"
        )
    peft_model = attach(backend, top_layers, rank)
    hidden = fit[0].inputs.hidden.shape[-1]
    head = Head(
        HeadConfig(kind="linear", layer=depth, hidden=hidden, use_base=True, model=model, fingerprint=fingerprint)
    )
    adapter = [p for p in peft_model.parameters() if p.requires_grad]
    groups = [(adapter, lr, 0.0), ([head.w], head_lr, 0.1), ([head.alpha], head_lr, 0.0)]
    opt = torch.optim.AdamW([{"params": ps, "lr": r, "weight_decay": wd} for ps, r, wd in groups])
    order = list(range(len(fit)))
    rng = random.Random(seed)
    history = [{"epoch": 0, "validation_log_loss": round(validation_loss(backend, head, validation), 4)}]
    best = (history[0]["validation_log_loss"], _snapshot(peft_model, head), 0)
    for epoch in range(1, epochs + 1):
        rng.shuffle(order)
        _epoch(backend, head, opt, [fit[k] for k in order], label_weight, rl_weight)
        vloss = round(validation_loss(backend, head, validation), 4)
        history.append({"epoch": epoch, "validation_log_loss": vloss})
        if vloss < best[0]:
            best = (vloss, _snapshot(peft_model, head), epoch)
    _restore(peft_model, head, best[1])
    preds = predict(backend, head, validation)
    temperatures = fit_temperatures(head, [(p, t, g) for p, (t, g, _) in zip(preds, labels(validation))])
    settings = {"kind": "lora", "top_layers": top_layers, "rank": rank, "lr": lr, "head_lr": head_lr}
    settings |= {"label_weight": label_weight, "rl_weight": rl_weight, "seed": seed}
    log = settings | {"epochs_kept": best[2], "history": history, "temperatures": temperatures}
    log |= {"train_questions": len(labels(fit)), "validation_questions": len(labels(validation))}
    head.cfg.adapter = "lora"
    head.cfg.notes.update(log)
    return peft_model, head, log


def _epoch(backend, head: Head, opt, units: Sequence[Unit], label_weight: float, rl_weight: float) -> None:
    """One pass over `units` in the order given, one AdamW step per unit."""
    head.train()
    for unit in units:
        s, parts = scores(backend, head, unit)
        loss = objective(s, unit.batch(*parts, label_weight=label_weight), rl_weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval()


def _snapshot(peft_model, head: Head) -> tuple[dict, dict]:
    adapter = {n: p.detach().clone() for n, p in peft_model.named_parameters() if p.requires_grad}
    return adapter, {k: v.clone() for k, v in head.state_dict().items()}


def _restore(peft_model, head: Head, snapshot: tuple[dict, dict]) -> None:
    adapter, head_state = snapshot
    params = dict(peft_model.named_parameters())
    with torch.no_grad():
        for n, v in adapter.items():
            params[n].copy_(v)
    head.load_state_dict(head_state)


def split_by_family(units: Sequence[Unit], family: str | None = None) -> tuple[list[Unit], list[Unit], str]:
    """Training and validation units: one family left out (`family`, or the one with the fewest questions,
    so that most data trains), or with a single family a 20% item split."""
    families = sorted({u.family for u in units})
    if len(families) < 2:
        items = sorted({u.item for u in units})
        random.Random(0).shuffle(items)
        held = set(items[: max(1, len(items) // 5)])
        return [u for u in units if u.item not in held], [u for u in units if u.item in held], "20% of items"
    if family is None:
        family = min(families, key=lambda f: (sum(len(u.gold) for u in units if u.family == f), f))
    return [u for u in units if u.family != family], [u for u in units if u.family == family], family


def train_adapter(
    backend,
    items: Sequence[Item],
    teacher: dict[str, list[float]],
    *,
    early: int,
    top_layers: int,
    rank: int,
    epochs: int,
    validation_family: str | None,
    rl_weight: float,
    label_weight: float,
    model: str,
    out: Path,
) -> dict:
    """`prefill train --kind lora`: a LoRA on the top `top_layers` layers with its head, the epoch chosen on
    the validation family, saved under `out` (lora/, final.*), and an early-exit head at `early` (below the
    adapter, so the adapter does not change what it reads); the training report."""
    label_weight = label_weight if teacher else 1.0
    units = extract(backend, items, backend.depth - top_layers, teacher)
    fit, validation, held = split_by_family(units, validation_family)
    peft_model, final, log = train(
        backend,
        fit,
        validation,
        top_layers=top_layers,
        rank=rank,
        epochs=epochs,
        label_weight=label_weight,
        rl_weight=rl_weight,
        model=model,
        fingerprint=backend.readout_fingerprint,
    )
    peft_model.save_pretrained(out / "lora")
    final.save(out / "final.json")
    report = {"final": log, "validation": held}
    if early:
        examples = fitting.extract(backend, items, [early], teacher)
        held_items = {u.item for u in validation}
        early_head, report["early"] = training.fit_early(
            [e for e in examples if e.item not in held_items],
            [e for e in examples if e.item in held_items],
            predict(backend, final, validation),
            early,
            0,
            model=model,
            fingerprint=backend.readout_fingerprint,
            rl_weight=rl_weight,
            label_weight=label_weight,
        )
        early_head.save(out / "early.json")
    report.update(items=len(items), saved=str(out))
    return report
