"""Trained readouts on tiny models: an untrained head answers like the plain engine, every invariance of
the packed path holds on the trained path too, early exit runs fewer layers, files are tied to the model,
and training moves the head towards its targets."""

from __future__ import annotations

import math

import pytest
import torch
from fastapi.testclient import TestClient

from prefill.engine import Engine
from prefill.evaluation.evaluate import Item
from prefill.heads import Head, HeadConfig, Heads, answer_key
from prefill.schema import Noul, Score
from prefill.serving.app import create_app
from prefill.training import fitting
from prefill.training import train as training

from .helpers import QUESTIONS, RAW, STATE, TOL, assert_invariances, head, make_backend, max_delta


def test_an_untrained_head_answers_like_the_plain_engine(tiny_model, tokenizer):
    # a head's base term is the raw whole-sequence log-likelihood (what it was trained on), uncorrected
    plain = Engine(make_backend(tiny_model, tokenizer), use_facts=False, scoring=RAW)
    untrained = Head(HeadConfig(kind="linear", layer=2, hidden=64, use_base=True))
    headed = Engine(make_backend(tiny_model, tokenizer), use_facts=False, heads=Heads(untrained))
    assert max_delta(plain.ask(STATE, QUESTIONS)[0], headed.ask(STATE, QUESTIONS)[0]) <= TOL


@pytest.mark.parametrize("kind", ["linear", "pointer", "classes"])
def test_trained_path_keeps_every_invariance(tiny_model, tokenizer, kind):
    engine = Engine(make_backend(tiny_model, tokenizer), use_facts=False, heads=Heads(head(kind), name="h"))
    plain = Engine(make_backend(tiny_model, tokenizer), use_facts=False)
    assert_invariances(engine, plain)


def test_early_exit_runs_fewer_layers(tiny_model, tokenizer):
    backend = make_backend(tiny_model, tokenizer)
    early = head("linear", layer=1, use_base=False)
    ran = []
    hook = backend.model.get_decoder().layers[1].register_forward_hook(lambda *a: ran.append(1))
    try:
        always = Engine(backend, use_facts=False, heads=Heads(head("linear"), early))
        early.cfg.exit_threshold = 0.0  # every question exits at layer 1
        d = always.decide(STATE, QUESTIONS)
        layer2_calls = len(ran)
        assert sorted(d.early_exit) == sorted(QUESTIONS) and layer2_calls == 1  # layer 2 ran for the state only
        early.cfg.exit_threshold = 1.01  # none exits: they resume at layer 2, as without the early head
        d = always.decide(STATE, QUESTIONS)
        assert d.early_exit == [] and len(ran) == layer2_calls + 1
        without = Engine(backend, use_facts=False, heads=Heads(head("linear")))
        assert max_delta(d.answers, without.ask(STATE, QUESTIONS)[0]) <= TOL
    finally:
        hook.remove()


def test_resuming_after_early_exit_is_exact(tiny_model, tokenizer):
    """Questions that do not exit continue from their layer-1 states; a subset of the tree continued alone
    gives the same final-layer features as the full-depth pass of the whole tree."""
    backend = make_backend(tiny_model, tokenizer)
    r = backend.renderer
    state, branches = r.state(STATE), [r.question(q) for q in QUESTIONS.values()]
    full = backend.features(state, branches, [2])
    pairs = backend.features_early_exit(state, branches, 1, 2, lambda i, f: i % 2 == 0)
    for i, (_shallow, deep) in enumerate(pairs):
        assert (deep is None) == (i % 2 == 0)
        if deep is not None:
            assert torch.allclose(deep.options, full[i].options, atol=1e-4)
            assert torch.allclose(deep.decision, full[i].decision, atol=1e-4)
            assert max(abs(a - b) for a, b in zip(deep.loglik, full[i].loglik)) < 1e-3
    assert len(backend.model.get_decoder().layers) == 2  # the layer list is restored


def test_files_are_tied_to_the_model_and_listed(tmp_path, tiny_model, tokenizer):
    r = head("pointer")
    r.cfg.fingerprint = "abc"
    r.save(tmp_path / "final.json")
    loaded = Heads.load(tmp_path, "abc")
    assert all(torch.equal(a, b) for a, b in zip(r.state_dict().values(), loaded.final.state_dict().values()))
    with pytest.raises(ValueError, match="trained on model"):
        Heads.load(tmp_path, "other")
    with pytest.raises(ValueError, match="other features .*train it again"):  # same weights, other features
        Heads.load(tmp_path, "abc+sequence-mean")
    engine = Engine(make_backend(tiny_model, tokenizer), heads=loaded)
    client = TestClient(create_app(engine))
    names = [m["name"] for m in client.get("/v1/models").json()["models"]]
    assert names[0] == f"tiny+{tmp_path.name}"
    body = {"model": names[0], "state": STATE, "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}
    r = client.post("/v1/systemone", json=body)
    assert r.status_code == 200 and r.json()["model"] == names[0]


def test_fallback_escalates_or_flags_low_confidence(tiny_model, tokenizer):
    strong = Engine(make_backend(tiny_model, tokenizer), use_facts=False, heads=Heads(head("linear", seed=1)))
    weak = Engine(make_backend(tiny_model, tokenizer), use_facts=False)
    flagged = Engine(make_backend(tiny_model, tokenizer), use_facts=False, fallback_below=1.01)
    d = flagged.decide(STATE, QUESTIONS)
    assert sorted(d.low_confidence) == sorted(QUESTIONS) and d.escalated == []
    client = TestClient(create_app(flagged))
    body = {"model": "tiny", "state": STATE, "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}
    assert client.post("/v1/systemone", json=body).json()["x_low_confidence"] == ["q"]
    escalating = Engine(make_backend(tiny_model, tokenizer), use_facts=False, fallback_below=1.01, fallback=strong)
    d = escalating.decide(STATE, QUESTIONS)
    assert sorted(d.escalated) == sorted(QUESTIONS)
    assert max_delta(d.answers, strong.ask(STATE, QUESTIONS)[0]) <= TOL
    never = Engine(make_backend(tiny_model, tokenizer), use_facts=False, fallback_below=0.0, fallback=strong)
    assert never.decide(STATE, QUESTIONS).escalated == []
    assert max_delta(never.ask(STATE, QUESTIONS)[0], weak.ask(STATE, QUESTIONS)[0]) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("rl_weight", [0.0, 1.0])
def test_training_fits_the_targets(tiny_model, tokenizer, rl_weight):
    """On features from the tiny model, a head learns labels the base model does not know."""
    backend = make_backend(tiny_model, tokenizer)
    items = []
    for i in range(24):
        angry = i % 2 == 0
        state = ("I am furious, this is unacceptable! " if angry else "Thanks, all good. ") + f"Order {i}."
        items.append(
            Item(
                state,
                {"a": Noul("Is the customer angry?"), "s": Score("How angry?", ["calm", "annoyed", "furious"])},
                {"a": angry, "s": 2 if angry else 0},
            )
        )
    examples = fitting.extract(backend, items, [1, 2])
    train_ids, val_ids = set(range(16)), set(range(16, 24))
    train = [e for e in examples if e.item in train_ids]
    val = [e for e in examples if e.item in val_ids]
    before = [
        max(range(len(p)), key=p.__getitem__) == e.gold
        for p, e in zip(fitting.predict(Head(HeadConfig("linear", 2, 64, True)), val, 1), val)
    ]
    final, early, report = training.fit_readouts(
        train, [1, 2], kind="linear", model="tiny", fingerprint="", rl_weight=rl_weight, label_weight=1.0
    )
    after = [max(range(len(p)), key=p.__getitem__) == e.gold for p, e in zip(fitting.predict(final, val, 1), val)]
    assert sum(after) == len(val) and sum(after) > sum(before)
    assert early is not None and early.cfg.exit_threshold is not None and "exit_fraction" in report["early"]
    # one family (a user's own task): the model selection holds items out, so it has a real validation loss
    # and the weight decay is the one with the lowest
    chosen = report["final"]
    assert chosen["held_out"] == "5-fold over items" and math.isfinite(chosen["held_out_log_loss"])
    assert all(math.isfinite(r["held_out_log_loss"]) for r in chosen["grid"])
    assert chosen["held_out_log_loss"] == min(r["held_out_log_loss"] for r in chosen["grid"])


@pytest.mark.slow
def test_one_task_training_fits_temperatures_on_held_out_items(tiny_model, tokenizer):
    """The single-task path (`prefill train` on a user's own labels, no family field): out-of-fold
    predictions for every item choose the weight decay and fit the temperatures (seen broken: NaN
    validation loss, temperatures left at 1, every epoch run)."""
    backend = make_backend(tiny_model, tokenizer)
    items = [
        Item(
            ("I am furious, this is unacceptable! " if i % 2 else "Thanks, all good. ") + f"Order {i}.",
            {"a": Noul("Is the customer angry?")},
            {"a": i % 2 == 1},
        )
        for i in range(30)
    ]
    examples = fitting.extract(backend, items, [2])
    final, early, report = training.fit_readouts(
        examples, [2], kind="linear", model="tiny", fingerprint="", rl_weight=0.0, label_weight=1.0
    )
    chosen = report["final"]
    assert early is None and chosen["held_out"] == "5-fold over items"
    assert math.isfinite(chosen["held_out_log_loss"]) and chosen["temperatures"]["noul"] != 1.0
    assert abs(float(final.temperature[0]) - chosen["temperatures"]["noul"]) < 1e-4  # the head applies it


def language_like(n_examples: int, options_informative: bool, seed: int = 0) -> list[fitting.Example]:
    """Which of eight answers is right depends on the text (the language of a sentence): the decision state
    lies near its answer's code; each answer's own state lies near the answer's code too, or is noise."""
    torch.manual_seed(seed)
    hidden, n, codes = 32, 8, torch.randn(8, 32)
    examples = []
    for i in range(n_examples):
        right = i % n
        decision = (codes[right] + 0.3 * torch.randn(hidden))[None]
        options = (codes if options_informative else torch.zeros(n, hidden)) + 0.3 * torch.randn(n, hidden)
        labels = [f"l{k}" for k in range(n)]
        examples.append(fitting.Example(i, "t", "choice", decision, options[:, None], torch.zeros(n), right, labels))
    return examples


def held_out_right(head: Head, val: list[fitting.Example]) -> int:
    return sum(max(range(len(p)), key=p.__getitem__) == e.gold for p, e in zip(fitting.predict(head, val, 0), val))


def fit(train: list[fitting.Example], kind: str) -> tuple[Head, dict]:
    final, _, report = training.fit_readouts(
        train, [1], kind=kind, model="m", fingerprint="", rl_weight=0.0, label_weight=1.0
    )
    return final, report["final"]


@pytest.mark.slow
def test_auto_kind_leaves_the_linear_head_where_the_answer_depends_on_the_text():
    """A linear head scores each answer from its own features alone and cannot learn which one matches the
    text; `kind="auto"` measures the kinds in model selection and keeps one that can (seen: a distilled
    student left at chance with a linear head)."""
    examples = language_like(80, options_informative=True)
    train, val = examples[:64], examples[64:]
    _, linear = fit(train, "linear")
    final, auto = fit(train, "auto")
    losses = auto["kinds_held_out_log_loss"]
    assert set(losses) == set(training.AUTO_KINDS) and auto["kind"] == final.cfg.kind != "linear"
    assert losses[final.cfg.kind] == min(losses.values()) < losses["linear"]
    assert linear["kind"] == "linear" and linear["held_out_log_loss"] > 1.5  # near log 8
    assert held_out_right(final, val) >= 14  # of 16 held-out texts


def test_a_classes_head_is_solved_to_the_optimum_of_its_penalised_loss():
    """A classes head is a convex problem (softmax regression plus alpha times the log-likelihood), so it is
    solved, not trained for a number of epochs: at the returned head the penalised loss has no gradient left,
    on soft targets as distillation gives them, and its penalty comes from the classes grid."""
    examples = language_like(80, options_informative=False)
    for e in examples:  # a teacher's soft distribution, its top answer the gold one
        e.teacher = torch.softmax(torch.randn(8) + 3.0 * torch.nn.functional.one_hot(torch.tensor(e.gold), 8), 0)
    cfg = HeadConfig(kind="classes", layer=1, hidden=32, use_base=True, model="m", fingerprint="")
    head, log = fitting.train_head(examples[:64], cfg, 0, label_weight=0.0, weight_decay=1e-2)
    b = fitting.batch(examples[:64], 0, 0.0)
    head.train()
    loss = fitting.objective(head(b.qtype, b.decision, b.options, b.loglik, b.answers), b)
    (loss + 1e-2 * (head.table**2).sum()).backward()
    largest = max(float(p.grad.abs().max()) for p in head.parameters() if p.grad is not None)
    assert largest < 1e-4 and log["epochs_kept"] > 1
    assert held_out_right(head.eval(), examples[64:]) >= 14
    final, report = fit(examples[:64], "classes")
    assert report["weight_decay"] in fitting.CLASSES_PENALTIES
    assert {r["weight_decay"] for r in report["grid"]} == set(fitting.CLASSES_PENALTIES)


@pytest.mark.slow
def test_model_selection_reads_every_fold_at_the_epochs_the_final_head_trains_for():
    """The held-out loss that picks the weight decay, the epochs and (`--kind auto`) the kind is read with
    every fold's head trained for the same chosen epochs, the ones the final head trains for. Stopping each
    fold at its own best epoch read a minimum chosen on the very rows it was measured on: an optimistic loss,
    which auto compared with a solved classes head's honest one. Labels partly wrong, so folds overfit."""
    examples = language_like(64, options_informative=True)
    flip = torch.Generator().manual_seed(1)
    for e in examples[::3]:
        e.gold = int(torch.randint(8, (1,), generator=flip))
    cfg = HeadConfig(kind="pointer", layer=1, hidden=32, use_base=True, model="m", fingerprint="")
    chosen, out_of_fold = fitting.choose(examples, cfg, 0, rl_weight=0.0, label_weight=1.0)
    assert chosen["epochs"] < 400  # stopped early: there was a best epoch to choose
    by_example = {id(e): p for p, e in out_of_fold}
    for rows, held in fitting.folds_of(examples)[1]:
        alone, _ = fitting.train_head(
            rows, cfg, 0, label_weight=1.0, weight_decay=chosen["weight_decay"], epochs=chosen["epochs"]
        )
        for p, e in zip(fitting.predict(alone, held, 0), held):
            assert max(abs(a - b) for a, b in zip(p, by_example[id(e)])) < 1e-5
    loss = -sum(math.log(p[e.gold]) for p, e in out_of_fold) / len(out_of_fold)
    assert loss == pytest.approx(chosen["held_out_log_loss"], abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pointer", "classes"])
def test_distilled_heads_are_chosen_against_the_teachers_distribution(kind):
    """Distillation trains on the teacher's distribution alone (label weight 0; the examples' "gold" is only
    its top answer), so model selection scores the held-out questions against that distribution, for a
    trained head and a solved one alike: what auto compares is what the head learns. With gold labels in
    the mix, against the gold label (the test above)."""
    examples = language_like(64, options_informative=True)
    noise = torch.Generator().manual_seed(2)
    for e in examples:
        e.teacher = torch.softmax(1.5 * torch.randn(8, generator=noise) + 2.0 * torch.eye(8)[e.gold], 0)
        e.gold = int(e.teacher.argmax())
    cfg = HeadConfig(kind=kind, layer=1, hidden=32, use_base=True, model="m", fingerprint="")
    chosen, out_of_fold = fitting.choose(examples, cfg, 0, rl_weight=0.0, label_weight=0.0)
    soft = -sum(float((e.teacher * torch.tensor(p).log()).sum()) for p, e in out_of_fold) / len(out_of_fold)
    top = -sum(math.log(p[e.gold]) for p, e in out_of_fold) / len(out_of_fold)
    assert chosen["held_out_log_loss"] == pytest.approx(soft, abs=1e-3)
    assert abs(soft - top) > 0.05  # the two targets tell apart here


@pytest.mark.slow
def test_classes_head_knows_answers_by_name():
    """Where the answers' own states say nothing about them (only the question's state tells), the pointer
    cannot learn and a weight vector per answer taught can; auto takes it. It reads answers by name: options
    listed in another order get the same scores, and an answer it was not taught gets the untrained score
    (alpha times the log-likelihood)."""
    examples = language_like(80, options_informative=False)
    train, val = examples[:64], examples[64:]
    _, pointer = fit(train, "pointer")
    final, auto = fit(train, "auto")
    assert auto["kind"] == final.cfg.kind == "classes" and pointer["held_out_log_loss"] > 1.5
    assert held_out_right(final, val) >= 14
    assert final.cfg.answers == [answer_key("choice", f"l{k}") for k in range(8)]
    e = val[0]
    decision, options, loglik = e.decision[0], e.options[:, 0], torch.linspace(-3.0, -1.0, 8)
    forward = final.score("choice", decision, options, loglik.tolist(), e.labels)
    backward = final.score("choice", decision, options.flip(0), loglik.flip(0).tolist(), e.labels[::-1])
    assert max(abs(a - b) for a, b in zip(forward, backward[::-1])) < 1e-5
    unknown = final.score("choice", decision, options, loglik.tolist(), ["l0", "l1", "other", *e.labels[3:]])
    alpha, temperature = float(final.alpha[1]), float(final.temperature[1])
    assert abs(unknown[2] - alpha * float(loglik[2]) / temperature) < 1e-5
    assert max(abs(a - b) for a, b in zip(unknown[:2] + unknown[3:], forward[:2] + forward[3:])) < 1e-5
