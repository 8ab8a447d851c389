"""LoRA readouts on tiny models: the training pass (frozen layers cached, top layers re-run with gradients)
is the served pass; training learns what the base does not know; the adapter, saved and merged into a
fresh copy of the model, answers exactly as it did in training, with the packed path's invariances."""

from __future__ import annotations

import copy

import pytest
import torch

from prefill.engine import Engine
from prefill.evaluation.evaluate import Item
from prefill.heads import Head, HeadConfig, Heads
from prefill.schema import Noul, Score
from prefill.training import lora

from .helpers import QUESTIONS, STATE, assert_invariances, make_backend


def test_the_training_pass_is_the_served_pass(tiny_model, tokenizer):
    backend = make_backend(copy.deepcopy(tiny_model), tokenizer)
    r = backend.renderer
    state, branches = r.state(STATE), [r.question(q) for q in QUESTIONS.values()]
    served, feats = backend.score(state, branches), backend.features(state, branches, [2])
    (inputs,) = backend.layer_inputs(state, branches, 1)
    with torch.no_grad():
        loglik, decision, options = backend.forward_from(inputs)
    for i, f in enumerate(feats):
        n = len(served[i])
        assert max(abs(a - b) for a, b in zip(loglik[i, :n].tolist(), served[i])) < 1e-3
        assert torch.allclose(options[i, :n], f.options[:, 0], atol=1e-4)
        assert torch.allclose(decision[i], f.decision[0], atol=1e-4)


def angry_items(n: int, family: str) -> list[Item]:
    items = []
    for i in range(n):
        angry = i % 2 == 0
        state = ("I am furious, this is unacceptable! " if angry else "Thanks, all good. ") + f"Order {i}."
        items.append(
            Item(
                state,
                {"a": Noul("Is the customer angry?"), "s": Score("How angry?", ["calm", "annoyed", "furious"])},
                {"a": angry, "s": 2 if angry else 0},
                family=family,
            )
        )
    return items


def correct(preds, units) -> int:
    return sum(max(range(len(p)), key=p.__getitem__) == g for p, (_, g, _) in zip(preds, lora.labels(units)))


@pytest.mark.slow
def test_lora_learns_saves_and_serves_what_it_learned(tiny_model, tokenizer, tmp_path):
    backend = make_backend(copy.deepcopy(tiny_model), tokenizer)
    units = lora.extract(backend, angry_items(16, "a") + angry_items(8, "b"), layer=1)
    fit, validation, family = lora.split_by_family(units)
    assert family == "b" and {u.family for u in fit} == {"a"}
    untrained = Head(HeadConfig("linear", 2, 64, True))
    before = lora.predict(backend, untrained, validation)
    peft_model, head, log = lora.train(
        backend,
        fit,
        validation,
        top_layers=1,
        rank=4,
        epochs=6,
        lr=1e-2,
        head_lr=1e-2,
        label_weight=1.0,
        model="tiny",
        fingerprint="fp",
    )
    after = lora.predict(backend, head, validation)
    assert correct(after, validation) == len(after) > correct(before, validation) and log["epochs_kept"] > 0
    peft_model.save_pretrained(tmp_path / "lora")
    head.save(tmp_path / "final.json")

    # a fresh copy of the base, the adapter merged: the served engine gives the trained answers
    readouts = Heads.load(tmp_path, "fp")
    assert readouts.adapter == tmp_path / "lora"
    served_backend = make_backend(copy.deepcopy(tiny_model), tokenizer)
    engine = Engine(served_backend, use_facts=False, heads=readouts)  # merges the adapter
    assert served_backend.adapter == readouts.adapter
    item = angry_items(8, "b")[0]
    answers, _ = engine.ask(item.state, item.questions)
    trained = after[:2]  # the first validation item's two questions, in declared order
    assert abs(answers["a"].noul - trained[0][0]) < 1e-4
    assert max(abs(answers["s"].probabilities[str(i)] - p) for i, p in enumerate(trained[1])) < 1e-4
    again, _ = Engine(served_backend, use_facts=False, heads=readouts).ask(item.state, item.questions)
    assert abs(again["a"].noul - answers["a"].noul) < 1e-6  # a second engine does not merge it twice
    with pytest.raises(ValueError, match="already has the adapter"):
        served_backend.merge_adapter(tmp_path / "other")

    # the merged model keeps every invariance, and the adapter (not only the head) changes the answers
    plain = Engine(make_backend(copy.deepcopy(tiny_model), tokenizer), use_facts=False, heads=Heads(head))
    assert_invariances(engine, plain)


def test_a_missing_adapter_is_refused(tiny_model, tokenizer, tmp_path):
    backend = make_backend(copy.deepcopy(tiny_model), tokenizer)
    units = lora.extract(backend, angry_items(4, "a"), layer=1)
    _, head, _ = lora.train(backend, units, units, top_layers=1, rank=2, epochs=1, fingerprint="fp")
    head.save(tmp_path / "final.json")
    with pytest.raises(ValueError, match="LoRA adapter"):
        Heads.load(tmp_path, "fp")
