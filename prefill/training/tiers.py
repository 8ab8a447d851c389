"""The three-tier cascade `prefill distill --student static` reports: the static student, a middle tier (the
base model) and the teacher, each hand-off by a confidence threshold, measured on the held-out questions."""

from __future__ import annotations

from collections.abc import Sequence

from ..engine import choice_confidence
from ..evaluation.metrics import argmax


def tier_record(
    student: Sequence[float], middle: Sequence[float], teacher: Sequence[float], student_s: float, middle_s: float
) -> dict:
    """One held-out question as the cascade sees it: each tier's confidence, whether its top answer is the
    teacher's, and its seconds."""
    top = argmax(teacher)
    return {
        "student_confidence": choice_confidence(student),
        "student_agrees": argmax(student) == top,
        "middle_confidence": choice_confidence(middle),
        "middle_agrees": argmax(middle) == top,
        "student_seconds": student_s,
        "middle_seconds": middle_s,
    }


def three_tiers(records: Sequence[dict], teacher_seconds: float, steps: int = 20, targets=(0.9, 0.95)) -> dict:
    """The cascade student -> middle -> teacher over the held-out questions: a question stays with the student
    when its confidence is at least `student_below`, else with the middle tier when its confidence there is at
    least `middle_below`, else the teacher answers (and agrees with itself). For each pair of thresholds (a grid
    of `steps`), each tier's share, the agreement with the teacher, and the mean seconds a question (each tier a
    question reaches costs its time); for each target agreement, the cheapest pair that reaches it."""
    n = len(records)
    if not n:
        return {"questions": 0, "targets": []}
    grid = []
    for i in range(steps + 1):
        for j in range(steps + 1):
            t1, t2 = i / steps, j / steps
            first = [r for r in records if r["student_confidence"] >= t1]
            rest = [r for r in records if r["student_confidence"] < t1]
            second = [r for r in rest if r["middle_confidence"] >= t2]
            third = len(rest) - len(second)
            agree = sum(r["student_agrees"] for r in first) + sum(r["middle_agrees"] for r in second) + third
            seconds = sum(r["student_seconds"] for r in records) + sum(r["middle_seconds"] for r in rest)
            seconds += third * teacher_seconds
            grid.append(
                {
                    "student_below": t1,
                    "middle_below": t2,
                    "student": len(first) / n,
                    "middle": len(second) / n,
                    "teacher": third / n,
                    "agreement": agree / n,
                    "seconds": seconds / n,
                }
            )
    alone = {
        "student": sum(r["student_agrees"] for r in records) / n,
        "middle": sum(r["middle_agrees"] for r in records) / n,
        "student_seconds": sum(r["student_seconds"] for r in records) / n,
        "middle_seconds": sum(r["middle_seconds"] for r in records) / n,
        "teacher_seconds": teacher_seconds,
    }
    chosen = []
    for target in targets:
        reached = [g for g in grid if g["agreement"] >= target]
        chosen.append(
            {"target": target, **(min(reached, key=lambda g: g["seconds"]) if reached else {"reached": False})}
        )
    return {"questions": n, "alone": alone, "targets": chosen}


def hand_off(report: dict, target: float) -> float | None:
    """The static student's hand-off threshold for a target agreement: the three-tier cascade's, else the
    two-tier one's (student -> teacher); None where neither reaches it."""
    tiers = report.get("cascade_three_tiers")
    if tiers:
        found = [t for t in tiers["targets"] if abs(t["target"] - target) < 1e-9 and t.get("reached", True)]
        if found:
            return found[0]["student_below"]
        if target not in [t["target"] for t in tiers["targets"]]:
            reached = [g for g in tiers["targets"] if g.get("reached", True) and g["target"] >= target]
            if reached:
                return reached[0]["student_below"]
    two = report.get("held_out", {}).get("cascade_for_target", {})
    return two.get("threshold") if two.get("reached", True) else None
