"""The real-task suite's draws (benchmarks/tasks.py, benchmarks/distill_tasks.py) on the Drugs.com reviews it
reads from a PyPI wheel: a label with fewer texts than asked gives all of them and the others as many as asked;
distillation rows with the unlabelled texts mixed in keep the labelled draw and carry gold null."""

from __future__ import annotations

import json
from collections import Counter

from benchmarks.distill_tasks import write_task
from benchmarks.tasks import CLINICS, CONDITIONS, items, other_condition_texts


def test_a_small_label_gives_all_its_texts_and_the_others_as_many_as_asked():
    available = Counter(label for _, label in CONDITIONS.rows())
    assert set(available) == set(CLINICS) and min(available.values()) < 40 < max(available.values())
    drawn = items(CONDITIONS, 400, seed=0)  # 40 a label asked
    gold = Counter(next(a.gold for a in asked if a.qid == "clinic") for _, asked in drawn)
    for label, n in available.items():
        assert gold[list(CLINICS).index(label)] == min(n, 40), label
    assert len({text for text, _ in drawn}) == len(drawn)


def test_distill_rows_mix_in_the_unlabelled_texts(tmp_path):
    labelled, _ = write_task("conditions", 200, 1, tmp_path / "a")
    mixed, questions = write_task("conditions", 200, 1, tmp_path / "b", unlabelled=True)
    alone = [json.loads(line) for line in labelled.read_text().splitlines()]
    rows = [json.loads(line) for line in mixed.read_text().splitlines()]
    assert all(r["gold"] in [name for name, _ in CLINICS.values()] for r in alone)
    assert sorted(r["text"] for r in rows if r["gold"] is None) == sorted(other_condition_texts())
    assert sorted(json.dumps(r) for r in rows if r["gold"] is not None) == sorted(json.dumps(r) for r in alone)
    assert rows != alone + [r for r in rows if r["gold"] is None]  # mixed in, not appended
    assert list(json.loads(questions.read_text())) == ["clinic"]
