"""Exactness and isolation of the one-pass engine, on tiny random Llama and Qwen2 models.

Each invariance is checked to max |Δp| <= 1e-4 in fp32, and the checks are shown to be able to fail: a
leaky mask (branches that see each other) moves answers by far more than the tolerance."""

from __future__ import annotations

import math
import random

import pytest
import torch

from prefill.backends import causal_lm
from prefill.engine import Engine
from prefill.schema import Choice, Noul
from prefill.scoring import Scoring

from .helpers import QUESTIONS, RAW, STATE, TOL, make_backend, max_delta


def test_answers_are_distributions_over_declared_options(tiny_engine):
    answers, usage = tiny_engine.ask(STATE, QUESTIONS)
    assert set(answers) == set(QUESTIONS)
    for qid, a in answers.items():
        q = QUESTIONS[qid]
        assert a.type == q.type
        if a.type == "choice":
            assert list(a.probabilities) == list(q.criteria)
            assert a.choice in q.criteria
            assert abs(sum(a.probabilities.values()) - 1) < 1e-9
    assert usage.input_tokens > 0 and usage.output_tokens == 0


def test_packed_equals_each_question_alone(tiny_engine):
    together, _ = tiny_engine.ask(STATE, QUESTIONS)
    for qid, q in QUESTIONS.items():
        alone, _ = tiny_engine.ask(STATE, {qid: q})
        assert max_delta(alone, {qid: together[qid]}) <= TOL


def test_shared_prompt_prefixes_are_read_once_and_stay_exact(tiny_engine):
    """Questions that begin alike share their first tokens' nodes in the tree; each still gets exactly
    what it gets alone."""
    qs = {
        f"q{i}": Noul(f"Does the customer mention {x}?")
        for i, x in enumerate(["a refund", "a refund today", "the invoice", "March", "a bank"])
    }
    qs["team"] = QUESTIONS["team"]
    r = tiny_engine.backend.renderer
    branches = [r.question(q) for q in qs.values()]
    tree = causal_lm.Tree.build(branches, 10)
    answer_nodes = sum(len(a) - 1 for b in branches for a in b.answers)
    prefixes = {b.prompt[:k] for b in branches for k in range(1, len(b.prompt) + 1)}  # one node each
    assert len(tree.ids) == len(prefixes) + answer_nodes
    assert len(prefixes) < sum(len(b.prompt) for b in branches) - 4 * 10  # the nouls share > 10 tokens
    together, _ = tiny_engine.ask(STATE, qs)
    for qid, q in qs.items():
        assert max_delta(tiny_engine.ask(STATE, {qid: q})[0], {qid: together[qid]}) <= TOL


def test_question_order_and_ids_do_not_matter(tiny_engine):
    base, _ = tiny_engine.ask(STATE, QUESTIONS)
    items = list(QUESTIONS.items())
    random.Random(1).shuffle(items)
    renamed = {f"renamed {i} 🙂": q for i, (_, q) in enumerate(items)}
    shuffled, _ = tiny_engine.ask(STATE, renamed)
    back = {qid: shuffled[f"renamed {i} 🙂"] for i, (qid, _) in enumerate(items)}
    assert max_delta(base, back) <= TOL


def test_option_order_does_not_change_any_probability(tiny_engine):
    q = QUESTIONS["team"]
    reversed_q = Choice(q.instructions, dict(reversed(list(q.criteria.items()))))
    a = tiny_engine.ask(STATE, {"q": q})[0]["q"]
    b = tiny_engine.ask(STATE, {"q": reversed_q})[0]["q"]
    assert list(b.probabilities) == list(reversed_q.criteria)  # keys follow the request's order
    for name in q.criteria:
        assert abs(a.probabilities[name] - b.probabilities[name]) <= TOL
    assert a.choice == b.choice


def test_chunking_does_not_change_answers(tiny_model, tokenizer):
    # raw scoring: the pass count below is the packed pass alone (the contextual prior's passes are counted
    # in test_scoring.py)
    one_chunk = Engine(make_backend(tiny_model, tokenizer, chunk_tokens=100_000), scoring=RAW)
    tiny_chunks = Engine(make_backend(tiny_model, tokenizer, chunk_tokens=1), scoring=RAW)  # every question alone
    a, _ = one_chunk.ask(STATE, QUESTIONS)
    b, _ = tiny_chunks.ask(STATE, QUESTIONS)
    assert one_chunk.backend.forward_calls == 2  # the state, then one packed pass
    assert tiny_chunks.backend.forward_calls >= 1 + 2 * len(QUESTIONS)  # prompt, then answers, per question
    assert max_delta(a, b) <= TOL


def test_packed_equals_rows(tiny_model, tokenizer):
    packed = Engine(make_backend(tiny_model, tokenizer, packing="packed"))
    rows = Engine(make_backend(tiny_model, tokenizer, packing="rows"))
    assert max_delta(packed.ask(STATE, QUESTIONS)[0], rows.ask(STATE, QUESTIONS)[0]) <= TOL


def test_scores_equal_full_sequence_likelihood(tiny_model, tokenizer):
    """Each answer's score is exactly log P(answer tokens | state + prompt), as a plain uncached
    forward over the concatenated sequence computes it."""
    backend = make_backend(tiny_model, tokenizer)
    state = backend.renderer.state(STATE)
    branches = [backend.renderer.question(q) for q in QUESTIONS.values()]
    scores = backend.score(state, branches)
    for b, per_answer in zip(branches, scores):
        for answer, got in zip(b.answers, per_answer):
            seq = list(state) + list(b.prompt) + list(answer)
            with torch.no_grad():
                logits = tiny_model(torch.tensor([seq])).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            start = len(state) + len(b.prompt)
            want = sum(float(logp[start + k - 1, t]) for k, t in enumerate(answer))
            assert abs(got - want) < 1e-3


def test_shared_first_tokens_are_told_apart(tiny_engine, tokenizer):
    q = QUESTIONS["fraud"]
    first = {tokenizer(n, add_special_tokens=False).input_ids[0] for n in q.criteria}
    assert len(first) < len(q.criteria)  # the options really do collide on their first token
    p = tiny_engine.ask(STATE, {"q": q})[0]["q"].probabilities
    assert abs(math.log(p["fraud"]) - math.log(p["fraud review"])) > 1e-3
    first_token = Engine(tiny_engine.backend, scoring={"choice": Scoring("first", "contextual")})
    tied = first_token.ask(STATE, {"q": q})[0]["q"].probabilities
    assert tied["fraud"] == tied["fraud review"]  # what this test catches: a first-token readout ties them


def test_255_options(tiny_engine):
    options = {"Billing": "Payments", **{f"Queue {i:03d}": f"Tickets for queue {i}" for i in range(1, 255)}}
    a = tiny_engine.ask(STATE, {"q": Choice("Which queue?", options)})[0]["q"]
    assert len(a.probabilities) == 255 and a.choice in options
    assert abs(sum(a.probabilities.values()) - 1) < 1e-9


def test_leaky_mask_is_detected(tiny_model, tokenizer, monkeypatch):
    """Fault injection: if branches could see each other, the invariance checks above would fail."""
    engine = Engine(make_backend(tiny_model, tokenizer))
    alone = {qid: engine.ask(STATE, {qid: q})[0][qid] for qid, q in QUESTIONS.items()}
    monkeypatch.setattr(
        causal_lm.Tree, "visibility", lambda self: torch.ones(len(self.ids), len(self.ids)).tril().bool()
    )
    leaked, _ = engine.ask(STATE, QUESTIONS)
    assert max_delta(alone, leaked) > 100 * TOL


def test_wrong_positions_are_detected(tiny_model, tokenizer, monkeypatch):
    """Fault injection: branch positions that run on instead of restarting from the parent change answers."""
    engine = Engine(make_backend(tiny_model, tokenizer))
    alone = {qid: engine.ask(STATE, {qid: q})[0][qid] for qid, q in QUESTIONS.items()}
    build = causal_lm.Tree.build

    def running_positions(chunk, n_state):
        t = build(chunk, n_state)
        t.positions = list(range(n_state, n_state + len(t.ids)))
        return t

    monkeypatch.setattr(causal_lm.Tree, "build", staticmethod(running_positions))
    wrong, _ = engine.ask(STATE, QUESTIONS)
    assert max_delta(alone, wrong) > 100 * TOL


def test_never_generates(tiny_model, tokenizer, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("generate must never be called")

    monkeypatch.setattr(tiny_model, "generate", refuse)
    engine = Engine(make_backend(tiny_model, tokenizer))  # the default scoring, content-free priors included
    engine.ask(STATE, QUESTIONS)
    engine.backend.forward_calls = 0
    engine.ask("Another ticket: the app crashes on launch.", QUESTIONS)
    assert engine.backend.forward_calls == 2  # one pass for the state, one for every question and answer


def test_identical_questions_are_scored_once(tiny_engine):
    answers, usage = tiny_engine.ask(STATE, {"a": QUESTIONS["team"], "b": QUESTIONS["team"]})
    single, usage1 = tiny_engine.ask(STATE, {"a": QUESTIONS["team"]})
    assert answers["a"] == answers["b"]
    assert usage.input_tokens == usage1.input_tokens


@pytest.mark.parametrize("n_questions", [300])
def test_many_questions_bounded_chunks(tiny_model, tokenizer, n_questions):
    engine = Engine(make_backend(tiny_model, tokenizer, chunk_tokens=512))
    qs = {f"q{i}": Noul(f"Is item {i} mentioned?") for i in range(n_questions)}
    answers, _ = engine.ask(STATE, qs)
    assert len(answers) == n_questions
    alone = engine.ask(STATE, {"q7": qs["q7"]})[0]["q7"]
    assert abs(alone.noul - answers["q7"].noul) <= TOL


def test_cached_state_gives_identical_answers(tiny_model, tokenizer):
    cached = Engine(make_backend(tiny_model, tokenizer), scoring=RAW)
    uncached = Engine(make_backend(tiny_model, tokenizer, state_cache_tokens=0), scoring=RAW)
    first, _ = cached.ask(STATE, QUESTIONS)
    calls = cached.backend.forward_calls
    again, _ = cached.ask(STATE, {"team": QUESTIONS["team"]})
    assert cached.backend.forward_calls == calls + 1  # the state was not read again
    assert max_delta(again, {"team": first["team"]}) <= TOL  # alone vs packed: rounding only
    fresh, _ = uncached.ask(STATE, QUESTIONS)
    uncached.ask(STATE, QUESTIONS)
    assert uncached.backend.forward_calls == 4
    assert fresh == first
    cached.ask("another state", {"r": QUESTIONS["refund"]})  # a second state cached beside the first
    assert cached.ask(STATE, QUESTIONS)[0] == first


def test_a_question_larger_than_a_chunk_is_split_exactly(tiny_model, tokenizer):
    """255 long options with a small chunk budget: the prompt extends the state, the answers run in
    several passes, and every probability matches the one-pass result."""
    options = {f"Queue {i:03d} for regional billing disputes": None for i in range(255)}
    q = {"q": Choice("Which queue?", options), "f": QUESTIONS["fraud"]}
    whole = Engine(make_backend(tiny_model, tokenizer, chunk_tokens=1_000_000))
    split = Engine(make_backend(tiny_model, tokenizer, chunk_tokens=300))
    a, _ = whole.ask(STATE, q)
    b, _ = split.ask(STATE, q)
    assert split.backend.forward_calls > 4  # state, prompt, several answer chunks, the other question
    assert max_delta(a, b) <= TOL


def test_requests_batched_equal_each_alone(tiny_model, tokenizer):
    """Cross-request batching (serving's scheduler, prefill batch): several requests' states run side by
    side and their questions share chunks, yet each answer equals the request's answer alone: states of
    different lengths, one state already cached and two fresh, two requests on the same state, a request
    the fact pass answers entirely, and the default scoring (with its content-free priors)."""
    requests = [
        (STATE, QUESTIONS, None),
        ("Short.", {"refund": QUESTIONS["refund"], "x": Noul("Is 12 greater than 7?")}, None),
        ("The parcel never came. " * 20, {"team": QUESTIONS["team"], "anger": QUESTIONS["anger"]}, None),
        (STATE, {"fraud": QUESTIONS["fraud"]}, None),
        ("The total is 40 EUR.", {"big": Noul("Is the total over 30 EUR?")}, None),
    ]
    alone = Engine(make_backend(tiny_model, tokenizer))
    expected = [alone.decide(*r) for r in requests]
    together = Engine(make_backend(tiny_model, tokenizer, chunk_tokens=2048))
    for _, questions, _ in requests:
        together.decide("Warm-up.", questions)  # the questions' content-free priors, cached
    together.decide(*requests[2])  # this state is cached, the others are not
    calls = together.backend.forward_calls
    got = together.decide_many(requests)
    for e, g in zip(expected, got):
        assert max_delta(e.answers, g.answers) <= TOL
        assert e.usage == g.usage and e.facts == g.facts
    assert got[4].facts == ["big"] and got[4].usage.input_tokens == 0
    # one pass for the two uncached states, one packed pass for every request's questions
    assert together.backend.forward_calls - calls == 2


def test_batched_mask_keeps_requests_apart(tiny_model, tokenizer):
    """The check above can fail: let a question see every state in the shared pass and it moves."""
    backend = make_backend(tiny_model, tokenizer, chunk_tokens=2048)
    r = backend.renderer
    jobs = [(r.state(STATE), [r.question(QUESTIONS["team"])]), (r.state("Short."), [r.question(QUESTIONS["team"])])]
    exact = backend.score_many(jobs)
    real = causal_lm.CausalLMBackend._tree_pass

    def leaky(self, cache, n_state, tree, layers=(), inputs_embeds=None, spans=None):
        return real(self, cache, n_state, tree, layers, inputs_embeds, None)  # every state visible to all

    backend.forget_states()
    causal_lm.CausalLMBackend._tree_pass = leaky
    try:
        leaked = backend.score_many(jobs)
    finally:
        causal_lm.CausalLMBackend._tree_pass = real
    assert max(abs(a - b) for a, b in zip(exact[1][0], leaked[1][0])) > 1e-2


def test_the_python_api_takes_questions_as_objects_or_in_their_wire_form(tiny_model, tokenizer):
    """`Prefill.ask` with a request's own JSON for a question answers exactly as with the object; what it
    cannot take is a TypeError or ValueError that says what it takes, not an AttributeError from inside."""
    from prefill.api import Prefill

    pf = Prefill.from_backend(make_backend(tiny_model, tokenizer), scoring=RAW, use_facts=False)
    objects = {"team": Choice("Which team?", ["Billing", "Tech"]), "angry": Noul("Is the customer angry?")}
    wire = {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": None, "Tech": None}}}
    mixed = pf.ask(STATE, {**wire, "angry": objects["angry"]})
    assert list(mixed) == ["team", "angry"] and mixed == pf.ask(STATE, objects)
    for bad in ("Is it?", [objects["angry"]]):
        with pytest.raises(TypeError, match="a mapping of id -> question"):
            pf.ask(STATE, bad)
    with pytest.raises(ValueError, match="criteria must be an object"):  # the wire's own rule
        pf.ask(STATE, {"team": {**wire["team"], "criteria": ["Billing", "Tech"]}})
    with pytest.raises(ValueError, match="options must be distinct: 'Tech' given twice"):
        Choice("Which team?", ["Tech", "Billing", "Tech"])
