"""Property tests: whatever the option names (any Unicode, shared prefixes, special-token look-alikes) and
their order, the answer is one of the declared options, keys round-trip byte-for-byte, the distribution
is proper, and confidence follows TypeSafe's formulas."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jevcompat.validate import choice_confidence as reference_choice_confidence
from jevcompat.validate import score_confidence as reference_score_confidence

from prefill.calibration import rescale
from prefill.engine import Engine, choice_confidence, score_confidence, softmax
from prefill.schema import Choice, Score
from prefill.scoring import log_normalised

from .helpers import make_backend, make_model

names = st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != "") | st.sampled_from(
    ["fraud", "fraud review", "<|im_end|>", "<|im_start|>assistant", "Yes", " ", "🙂", "환불"]
)


@pytest.fixture(scope="module")
def engine(tokenizer):
    return Engine(make_backend(make_model("qwen2", len(tokenizer), seed=3), tokenizer))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=st.lists(names, min_size=2, max_size=8, unique=True), state=st.text(max_size=60), data=st.data())
def test_choice_answer_is_always_declared(engine, options, state, data):
    shuffled = data.draw(st.permutations(options))
    a = engine.ask(state, {"q": Choice("Pick one.", options)})[0]["q"]
    b = engine.ask(state, {"q": Choice("Pick one.", shuffled)})[0]["q"]
    assert list(a.probabilities) == options and a.choice in options
    assert all(0 <= p <= 1 and math.isfinite(p) for p in a.probabilities.values())
    assert abs(sum(a.probabilities.values()) - 1) < 1e-9
    assert max(abs(a.probabilities[o] - b.probabilities[o]) for o in options) <= 1e-4
    assert a.confidence == pytest.approx(reference_choice_confidence(list(a.probabilities.values())))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(levels=st.lists(st.text(min_size=1, max_size=10), min_size=2, max_size=10))
def test_score_is_the_expectation(engine, levels):
    a = engine.ask("The customer is upset.", {"q": Score("How upset?", levels)})[0]["q"]
    p = [a.probabilities[str(i)] for i in range(len(levels))]
    assert a.score == pytest.approx(sum(i * x for i, x in enumerate(p)))
    assert 0 <= a.score <= len(levels) - 1
    assert a.confidence == pytest.approx(reference_score_confidence(p))


@given(st.lists(st.floats(min_value=0, max_value=1), min_size=2, max_size=10).filter(lambda p: sum(p) > 0))
def test_confidence_formulas_match_the_reference(raw):
    p = [x / sum(raw) for x in raw]
    assert choice_confidence(p) == pytest.approx(reference_choice_confidence(p), abs=1e-12)
    assert score_confidence(p) == pytest.approx(reference_score_confidence(p), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-60, 0), min_size=2, max_size=12).flatmap(
        lambda xs: st.tuples(st.just(xs), st.permutations(range(len(xs))))
    )
)
def test_reordered_options_get_the_same_bits(case):
    """Softmax, log-normalising and calibration sum their normaliser exactly: declaring the options in another
    order cannot move a probability by even one bit (a plain sum can: [1, 1.2e-16, 1.2e-16] sums to 1 + 4e-16
    one way and 1 + 2e-16 the other, which failed the `--exact` reordering test on one CPU)."""
    logits, order = case
    moved = [logits[i] for i in order]
    assert softmax(moved) == [softmax(logits)[i] for i in order]
    assert log_normalised(moved) == [log_normalised(logits)[i] for i in order]
    probs = softmax(logits)
    assert rescale([probs[i] for i in order], 1.7) == [rescale(probs, 1.7)[i] for i in order]
    tiny = math.log(1.2e-16)
    assert softmax([0.0, tiny, tiny]) == softmax([tiny, tiny, 0.0])[::-1]


def test_softmax_never_nan():
    assert softmax([float("-inf"), float("-inf")]) == [0.5, 0.5]
    assert softmax([float("-inf"), 0.0]) == [0.0, 1.0]
    assert softmax([-1e6, -1e6 - 1]) == pytest.approx([1 / (1 + math.exp(-1)), 1 - 1 / (1 + math.exp(-1))])
    assert softmax([0.0, math.log(3)], temperature=2.0) == pytest.approx(
        [1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3))]
    )
