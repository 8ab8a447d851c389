"""The lab's generated data sets, read as the product reads them: the numbers-and-dates set decided by the fact
pass (prefill/facts.py) exactly, and never a question that holds no number."""

from __future__ import annotations

import pytest

from benchmarks.data.numbers_dates import rows
from prefill.evaluation.evaluate import gold_index, parse_questions
from prefill.facts import decide

pytestmark = pytest.mark.slow  # the lab's runs, servers and downloads: the full tier


def test_generated_set_every_decision_is_right_and_no_number_free_question_is_touched():
    decided = 0
    for row in rows(80, seed=5):
        for qid, q in parse_questions(row["questions"]).items():
            probs = decide(row["state"], q)
            if qid in ("card", "paid", "db", "enterprise", "compound"):
                assert probs is None, (row["state"], q)
            elif probs is not None:
                decided += 1
                assert probs[gold_index(q, row["gold"][qid])] == 1.0, (row["state"], q)
    assert decided >= 350  # of 400 numeric questions
