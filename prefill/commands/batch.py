"""prefill batch: the same questions for every row of a JSONL, CSV or Parquet file, resumable."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from ..settings import Settings
from .common import add_rows_arguments, build_prefill, read_arg

HELP = "answer the same questions for every row of a JSONL, CSV or Parquet file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_rows_arguments(p)
    p.add_argument(
        "--out",
        required=True,
        help="the rows plus the answers: .jsonl, .csv or .parquet; rerun the "
        "same command to continue an interrupted job",
    )
    p.add_argument(
        "--on-error",
        default="skip",
        choices=["skip", "stop"],
        help="a row that cannot be answered: record it in prefill_error and go on, or stop (default skip)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows run together in shared passes, and journaled together (default 16; 512 for a static student "
        "alone, whose rows take well under a millisecond each)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="spread the rows over engine actors with Ray Data: a local Ray, or the cluster at ADDRESS",
    )
    p.add_argument(
        "--ray-actors",
        type=int,
        default=2,
        help="with --ray: engine actors, each with its own model copy and an equal share of the CPUs (default 2)",
    )


def engine(settings: Settings, questions=None):
    """The engine the settings describe (picklable as functools.partial(engine, settings, questions): Ray
    actors): a static student alone where it needs no model behind it (`static_alone`), else the model's."""
    return static_alone(settings, questions) or build_prefill(settings, "batch").engine


def static_alone(settings: Settings, questions) -> Any:
    """A static student (`--readout` from `prefill distill --student static`) that was taught every one of
    `questions` and hands nothing on (`--student-below 0`) answers alone: no model is loaded, and with it
    neither torch, so a batch runs at the student's own speed (docs/training.md). None where a model is needed."""
    from ..static import StaticEngine, StaticStudent, is_static

    if settings.student_below != 0 or len(settings.readouts) != 1 or not questions:
        return None
    name, path = settings.readouts[0]
    if not is_static(path):
        return None
    student = StaticStudent(path)
    if not all(student.knows(q) for q in questions.values()):
        return None
    return StaticEngine(student, served_as=name)


def run(settings: Settings, args) -> int:
    from ..batch import BatchError, RowFailed, load_questions
    from ..batch import run as run_batch
    from ..batch_ray import ray_answers
    from ..loading import ModelNotFound

    source, out = Path(args.input), Path(args.out)
    try:
        if not source.exists():
            raise BatchError(f"{source}: no such file")
        questions = load_questions(read_arg(args.questions, as_json=True))
        if args.ray:  # the engines load in the actors, not here
            try:
                import ray  # noqa: F401
            except ImportError:
                raise BatchError('--ray needs Ray: pip install "prefill[ray]"') from None
            local, answer = (
                None,
                ray_answers(
                    functools.partial(engine, settings, questions),
                    questions,
                    args.state_field,
                    actors=args.ray_actors,
                    address=None if args.ray == "local" else args.ray,
                ),
            )
        else:
            local, answer = engine(settings, questions), None
        summary = run_batch(
            local,
            source,
            questions,
            out,
            state_field=args.state_field,
            on_error=args.on_error,
            batch_size=args.batch_size or getattr(local, "rows_per_batch", 16),
            answer=answer,
        )
    except (BatchError, ModelNotFound, OSError, json.JSONDecodeError) as e:  # RowFailed: the job; the rest: usage
        print(f"prefill batch: {e}", file=sys.stderr)
        return 1 if isinstance(e, RowFailed) else 2
    except KeyboardInterrupt:
        print(
            "\nprefill batch: interrupted; the finished rows are kept: rerun the same command to continue",
            file=sys.stderr,
        )
        return 130
    skipped = ""
    if summary.skipped:
        lines = ", ".join(str(n) for n, _ in summary.skipped[:20]) + (" ..." if len(summary.skipped) > 20 else "")
        skipped = f", {len(summary.skipped)} skipped (lines {lines}; see {out}'s prefill_error column)"
    resumed = f" (continued after {summary.resumed_from} rows done before)" if summary.resumed_from else ""
    print(f"prefill batch: {summary.answered} rows answered{resumed}{skipped} -> {out}", file=sys.stderr)
    return 0
