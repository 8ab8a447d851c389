"""Training-free token rules and corrections (prefill/scoring.py) on tiny random models: each rule is what a
plain forward gives, the contextual correction divides out exactly the content-free prior, and corrected
answers keep every invariance of the packed path (packed vs alone, ids, question and option order)."""

from __future__ import annotations

import math

import pytest
import torch

from prefill.api import Prefill
from prefill.engine import Engine, softmax
from prefill.schema import Choice, Noul
from prefill.scoring import CONTENT_FREE, TOKEN_RULES, Scoring
from prefill.settings import Settings

from .helpers import QUESTIONS, RAW, STATE, TOL, assert_invariances, make_backend


def plain_token_logprobs(model, state: list[int], prompt, answer) -> list[float]:
    seq = list(state) + list(prompt) + list(answer)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
    start = len(state) + len(prompt)
    return [float(logp[start + k - 1, t]) for k, t in enumerate(answer)]


@pytest.mark.parametrize("tokens", TOKEN_RULES)
def test_each_token_rule_is_what_a_plain_forward_gives(tiny_model, tokenizer, tokens):
    engine = Engine(make_backend(tiny_model, tokenizer), scoring={t: Scoring(tokens) for t in RAW})
    r = engine.backend.renderer
    state = r.state(STATE)
    branches = [r.question(q) for q in QUESTIONS.values()]
    got = engine.scores(state, branches, [q.type for q in QUESTIONS.values()])
    for b, per_answer in zip(branches, got):
        assert b.end >= 1
        for answer, score in zip(b.answers, per_answer):
            lp = plain_token_logprobs(tiny_model, state, b.prompt, answer)
            want = {"whole": sum(lp), "noend": sum(lp[: -b.end]), "mean": sum(lp) / len(lp), "first": lp[0]}[tokens]
            assert abs(score - want) < 1e-3


@pytest.mark.parametrize("correction,weight", [("contextual", 1.0), ("pmi", 1.0), ("pmi", 0.5), ("pmi", 0.0)])
def test_the_correction_divides_out_the_content_free_prior(tiny_model, tokenizer, correction, weight):
    """score - λ·log p_cf: all of the prior (λ = 1), half of it, none of it (the raw likelihood)."""
    backend = make_backend(tiny_model, tokenizer)
    raw = Engine(backend, scoring=RAW, use_facts=False)
    engine = Engine(backend, scoring={t: Scoring("whole", correction, weight) for t in RAW}, use_facts=False)
    got = engine.ask(STATE, QUESTIONS)[0]
    for qid, q in QUESTIONS.items():
        p_state = raw.probabilities(STATE, {qid: q})[0][qid]
        p_free = [raw.probabilities(text, {qid: q})[0][qid] for text in CONTENT_FREE[correction]]
        prior = [sum(p[k] for p in p_free) / len(p_free) for k in range(len(p_state))]
        want = softmax([math.log(a) - weight * math.log(b) for a, b in zip(p_state, prior)])
        have = [got[qid].noul, 1 - got[qid].noul] if q.type == "noul" else list(got[qid].probabilities.values())
        assert max(abs(x - y) for x, y in zip(have, want)) <= TOL


@pytest.mark.parametrize(
    "way", ["whole+contextual", "first+contextual", "mean+pmi", "noend+contextual", "whole+pmi*0.5"]
)
def test_corrected_answers_keep_every_invariance(tiny_model, tokenizer, way):
    scoring = {t: Scoring.parse(way) for t in RAW}
    engine = Engine(make_backend(tiny_model, tokenizer), scoring=scoring)
    assert_invariances(engine, Engine(make_backend(tiny_model, tokenizer), scoring=RAW))
    # and a fresh engine (nothing cached) gives the same answers as one whose priors came from other requests
    fresh = Engine(make_backend(tiny_model, tokenizer), scoring=scoring)
    for qid, q in QUESTIONS.items():
        a, b = fresh.ask(STATE, {qid: q})[0][qid], engine.ask(STATE, QUESTIONS)[0][qid]
        pa = [a.noul] if a.type == "noul" else list(a.probabilities.values())
        pb = [b.noul] if b.type == "noul" else list(b.probabilities.values())
        assert max(abs(x - y) for x, y in zip(pa, pb)) <= TOL


def test_the_prior_costs_passes_once_per_new_question(tiny_model, tokenizer):
    engine = Engine(make_backend(tiny_model, tokenizer), scoring={t: Scoring("whole", "contextual") for t in RAW})
    engine.ask(STATE, QUESTIONS)
    n_free = len(CONTENT_FREE["contextual"])
    assert engine.backend.forward_calls == 2 + 2 * n_free  # the request; each content-free state and the tree
    engine.ask("The app crashes on launch since the update.", QUESTIONS)
    assert engine.backend.forward_calls == 2 + 2 * n_free + 2  # priors cached: one state, one packed pass
    engine.ask("Another ticket.", {"new": Noul("Is this about shipping?")})
    assert engine.backend.forward_calls == 2 + 2 * n_free + 2 + 2 + n_free  # content-free states are cached
    engine.forget_priors()  # as if never asked (prefill bench times it): its priors' passes again
    engine.ask("Another ticket.", {"new": Noul("Is this about shipping?")})
    # the states (this one and the content-free ones) are still cached: the request's tree and each prior's
    assert engine.backend.forward_calls == 2 + 2 * n_free + 2 + 2 + n_free + 1 + n_free


def test_a_question_that_leans_whatever_the_text_is_evened_out(tiny_model, tokenizer):
    """What the correction is for: the answer lean a question has on content-free input is divided out. With
    PMI's single content-free state (the empty text), that state's own answers come out exactly uniform."""
    engine = Engine(
        make_backend(tiny_model, tokenizer), scoring={t: Scoring("whole", "pmi") for t in RAW}, use_facts=False
    )
    raw = Engine(engine.backend, scoring=RAW, use_facts=False)
    q = {"q": Choice("Which team?", ["Billing", "Technical", "Sales"])}
    leaning = raw.probabilities("", q)[0]["q"]
    assert max(leaning) - min(leaning) > 0.05  # the raw model does lean
    evened = engine.probabilities("", q)[0]["q"]
    assert max(abs(p - 1 / 3) for p in evened) <= TOL


def test_scoring_names_parse_and_bad_ones_are_refused():
    assert Scoring.parse("first+contextual") == Scoring("first", "contextual")
    assert str(Scoring.parse("whole")) == "whole"
    assert Scoring.parse("whole+pmi*0.5") == Scoring("whole", "pmi", 0.5)
    assert str(Scoring("whole", "pmi", 0.75)) == "whole+pmi*0.75" and str(Scoring("whole", "pmi")) == "whole+pmi"
    for bad in ("whole+pmi*2", "whole+pmi*x"):
        with pytest.raises(ValueError):
            Scoring.parse(bad)
    with pytest.raises(ValueError):
        Scoring.parse("last")
    with pytest.raises(ValueError):
        Scoring.parse("whole+magic")


def test_python_scoring_keys_are_read_as_the_command_line_reads_them(model_dir):  # noqa: F811
    """`Prefill(scoring={"all": ...})` set no type at all until 2026-12-04 ("all" was a key no one read), and a
    misspelt type was ignored the same way: the answers stayed PMI's with no word said."""
    pf = Prefill(str(model_dir), scoring={"all": "whole", "score": "first"}, calibration=None, facts=False)
    assert pf.engine.scoring == {**RAW, "score": Scoring("first")}
    state, q = "Order #1 was charged twice.", Choice("Which team?", ["Billing", "Technical support"])
    plain = Engine(pf.backend, scoring=RAW, use_facts=False).ask(state, {"q": q})[0]["q"]
    pmi = Engine(pf.backend, use_facts=False).ask(state, {"q": q})[0]["q"]
    assert pf.ask(state, q).probabilities == plain.probabilities != pmi.probabilities
    with pytest.raises(ValueError, match="noul, choice, score or all, not 'chioce'"):
        Prefill(str(model_dir), scoring={"chioce": "whole"})


def test_python_settings_are_checked_as_the_command_line_checks_them():
    """Built in Python, `Settings` refuses what the command line refuses (before any model loads) and reads
    the command line's own forms: `facts="off"` was a true string, so the fact pass stayed on."""
    assert Settings(facts="off").facts is False and Settings(calibration="none").calibration is None
    assert Settings(facts=False, system="on").system is True
    for bad, says in (
        ({"facts": "no"}, "facts is True or False"),
        ({"route": "Encoder"}, "route must be one of auto, decoder, encoder"),
        ({"dtype": "bf16"}, "dtype must be one of auto, float32, bfloat16"),
        ({"scoring": {"choise": "whole"}}, "not 'choise'"),
        ({"scoring": {"all": "last"}}, "the token rule must be one of"),
    ):
        with pytest.raises(ValueError, match=says):
            Settings(**bad)


def test_a_question_read_with_its_opposite():
    """`with_opposite`: a lean the two answers share cancels, agreeing evidence adds, it is symmetric, and
    certain answers stay finite."""
    from prefill import with_opposite

    assert abs(with_opposite(0.8, 0.8) - 0.5) < 1e-12  # yes to both: no evidence either way
    assert abs(with_opposite(0.7, 0.3) - 0.7) < 1e-12  # the opposite agrees: the same answer
    assert with_opposite(0.9, 0.6) > 0.5 > with_opposite(0.6, 0.9)  # more evidence for the question than against
    assert abs(with_opposite(0.9, 0.6) + with_opposite(0.6, 0.9) - 1) < 1e-12
    assert abs(with_opposite(0.99, 0.5) - 1 / (1 + 99**-0.5)) < 1e-12  # log-odds averaged, not probabilities
    assert with_opposite(1.0, 0.0) > 0.999 and with_opposite(0.0, 1.0) < 0.001


def test_a_question_asked_with_its_opposite_is_read_with_it_in_the_same_pass(tiny_model, tokenizer):
    """`x_opposite`: the question and its opposite (yes and no swapped in its criteria) asked isolated in the
    request's one pass, read together by `with_opposite`; packed with other questions, under another id, or
    beside the opposite asked on its own, the same answer."""
    from prefill import with_opposite

    crit = {"true": "the customer wants money back", "false": "anything else"}
    paired = Noul("Is this a refund request?", crit, x_opposite="Is this about something other than a refund?")
    plain, opposite = paired.alone(), Noul(paired.x_opposite, {"true": crit["false"], "false": crit["true"]})
    apart_engine = Engine(make_backend(tiny_model, tokenizer))
    apart = apart_engine.probabilities(STATE, {"q": plain, "o": opposite})[0]
    engine = Engine(make_backend(tiny_model, tokenizer))
    got, n_tokens, _ = engine.probabilities(STATE, {"q": paired})
    assert engine.backend.forward_calls == apart_engine.backend.forward_calls  # the same passes, no more
    assert list(got) == ["q"] and n_tokens > engine.probabilities(STATE, {"q": plain})[1]
    want = with_opposite(apart["q"][0], apart["o"][0])
    assert abs(got["q"][0] - want) <= 1e-6 and abs(sum(got["q"]) - 1) <= 1e-9
    assert abs(want - apart["q"][0]) > 1e-3  # the opposite did move it
    for questions in ({**QUESTIONS, "renamed": paired}, {"o": opposite, "renamed": paired, **QUESTIONS}):
        again = engine.probabilities(STATE, dict(reversed(questions.items())))[0]
        assert abs(again["renamed"][0] - want) <= TOL and "q" not in again
    assert abs(engine.probabilities(STATE, {"o": opposite, "q": paired})[0]["o"][0] - apart["o"][0]) <= TOL
