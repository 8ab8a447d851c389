"""Labelled tasks that install offline: sys1bench's policy-labelled generators, as prefill questions.

Each item is (state, {id: question}, {id: gold}) with gold an option name (choice), a level index
(score) or a bool (noul)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefill.schema import Choice, Noul, Score

GENERATORS = ("support_tickets", "phishing_email", "log_triage", "policy_compliance", "guardrail_intent")


@dataclass
class Item:
    family: str
    state: Any
    questions: dict[str, Noul | Choice | Score]
    gold: dict[str, Any]


def sys1bench_items(n_per_family: int, seed: int = 7, families: tuple[str, ...] = GENERATORS) -> list[Item]:
    from sys1bench.generators import get_generator
    items = []
    for family in families:
        for task in get_generator(family, n=n_per_family, seed=seed).generate():
            questions, gold = {}, {}
            for qid, q in task.questions.items():
                if q.ground_truth is None:
                    continue
                if q.type == "noul":
                    questions[qid] = Noul(q.instructions)
                elif q.type == "choice":
                    keys = [c.key for c in q.criteria]
                    if q.ground_truth not in keys:  # "none of the above" items: not a declared option
                        continue
                    questions[qid] = Choice(q.instructions, {c.key: c.description or None for c in q.criteria})
                else:
                    levels = [c.level for c in q.criteria]
                    questions[qid] = Score(q.instructions, [c.description or str(c.level) for c in q.criteria])
                    gold[qid] = levels.index(q.ground_truth)
                    continue
                gold[qid] = q.ground_truth
            if questions:
                items.append(Item(family, task.state, questions, gold))
    return items


def gold_index(question: Noul | Choice | Score, gold: Any) -> int:
    """The gold answer as an index into the question's declared answers."""
    if isinstance(question, Noul):
        return 0 if gold else 1
    if isinstance(question, Choice):
        return list(question.criteria).index(gold)
    return int(gold)
