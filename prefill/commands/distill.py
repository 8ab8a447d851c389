"""prefill distill: a slow model that answers well teaches a fast prefill on the user's own unlabelled rows
(prefill/training/distill.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..settings import Settings
from .common import add_kind_argument, add_rows_arguments, build_prefill, read_arg

HELP = "teach a fast prefill head from a slower model's answers on your own rows"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_rows_arguments(p)
    p.add_argument(
        "--gold-field",
        default=None,
        help="a field with gold labels ({question id: label}, or the label for one question): both "
        "accuracies are reported on the held-out rows",
    )
    p.add_argument(
        "--teacher",
        default=None,
        metavar="URL",
        help="the teacher's base URL, with or without /v1: an OpenAI-compatible chat server (--teacher-kind "
        "openai: vLLM, llama.cpp's server, Ollama, a hosted API) or a System One server",
    )
    p.add_argument("--teacher-kind", default="openai", choices=["openai", "systemone"])
    p.add_argument(
        "--teacher-model",
        default=None,
        help="with --teacher: the model name the server serves; without: a model prefill loads here "
        "as the teacher (e.g. qwen2.5-coder-1.5b-instruct)",
    )
    p.add_argument("--teacher-key", default=None, help="Bearer key for --teacher")
    p.add_argument("--teacher-timeout", type=float, default=120.0, help="seconds per teacher request (default 120)")
    p.add_argument("--concurrency", type=int, default=4, help="teacher requests at once (a remote teacher; default 4)")
    p.add_argument("--rate", type=float, default=None, help="at most this many teacher requests a second")
    p.add_argument("--retries", type=int, default=2, help="retries per row before it is recorded as failed")
    p.add_argument("--holdout", type=float, default=0.2, help="share of rows held out for the report (default 0.2)")
    p.add_argument(
        "--target-agreement",
        type=float,
        default=0.95,
        help="the cascade's target: the threshold escalating fewest questions that reaches it",
    )
    add_student_arguments(p)
    add_kind_argument(p, "auto", more_help=" on the training rows")
    p.add_argument(
        "--no-curve",
        action="store_true",
        help="skip the learning curve (the head refitted on a quarter and a half of the training rows, scored "
        "on the held-out ones beside the head trained on all: whether asking the teacher more rows would pay)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        required=True,
        help="a folder: the head (what prefill serve --readout takes), teacher.jsonl (rerun the same "
        "command to continue) and distill.json (the report)",
    )


def add_student_arguments(p: argparse.ArgumentParser) -> None:
    """What the student is: a head on a model, or a static student (with its table and its cascade's middle)."""
    p.add_argument(
        "--student",
        default="model",
        choices=["model", "static"],
        help="model: a head on --model's hidden states (the decoder or the encoder route); static: a static "
        "student (a table lookup and a small head per question, numpy only, well under a millisecond a question: "
        "prefill/static.py), served in front of the base model",
    )
    p.add_argument(
        "--table-from",
        default="all-minilm-l6-v2",
        metavar="ENCODER",
        help="--student static: the local encoder its static embedding table is built from (once, cached)",
    )
    p.add_argument(
        "--middle",
        default="auto",
        metavar="MODEL",
        help="--student static: the base model the report's three-tier cascade measures between the student and "
        "the teacher (auto: --model, else the default model; none: two tiers)",
    )


def teacher_of(args, settings: Settings):
    """How to make the teacher: a remote one (built now, so a bad option fails before any row is read; it makes
    no request until asked), or a model prefill loads (its name resolved now, the weights loaded only when a
    row needs asking)."""
    from ..api import Prefill
    from ..fallback import remote
    from ..loading import resolve

    if args.teacher:
        options = dict(model=args.teacher_model, api_key=args.teacher_key, timeout=args.teacher_timeout)
        teacher = remote(args.teacher, args.teacher_kind, "--teacher-model", **options)
        return lambda: teacher
    if not args.teacher_model:
        raise ValueError("give the teacher: --teacher URL, or --teacher-model NAME for a model prefill loads")
    resolve(args.teacher_model, settings.dtype)
    return lambda: Prefill(settings=settings.replace(model=args.teacher_model, readouts=(), fallback_below=None)).engine


def run(settings: Settings, args) -> int:
    from ..batch import BatchError, load_questions
    from ..loading import ModelNotFound
    from ..training import distill

    out = Path(args.out)
    try:
        questions = load_questions(read_arg(args.questions, as_json=True))
        rows, skipped = distill.read_distill_rows(Path(args.input), questions, args.state_field, args.gold_field)
        if len(rows) < 2:
            raise ValueError(f"{args.input}: {len(rows)} readable rows; distilling needs at least two")
        teacher = teacher_of(args, settings)
        journal = distill.Journal(out / "teacher.jsonl", questions)
    except (BatchError, ModelNotFound, OSError, ValueError, json.JSONDecodeError) as e:
        print(f"prefill distill: {e}", file=sys.stderr)
        return 2
    local = not args.teacher
    entries = distill.teach(
        teacher,
        rows,
        questions,
        journal,
        concurrency=1 if local else args.concurrency,
        retries=args.retries,
        rate=args.rate,
    )
    train_rows, held = distill.split(rows, args.holdout, args.seed)
    if args.student == "static":
        return run_static(settings, args, rows, skipped, train_rows, held, entries, questions, journal)
    items, targets = distill.student_items(train_rows, entries, questions)
    if not items:
        print(nothing_taught(distill.teacher_summary(entries, questions), journal.path), file=sys.stderr)
        return 1
    student = build_prefill(settings.replace(readouts=(), fallback_below=None), "distill")
    trained, curve = train_student(student, items, targets, distill.student_items(held, entries, questions), args)
    engine = student.add_readout(str(out), f"{student.name}+distilled")
    report = {
        "teacher": args.teacher or args.teacher_model,
        "student": engine.name,
        "rows": {"read": len(rows), "unreadable": len(skipped), "train": len(train_rows), "held_out": len(held)},
        "teacher_answers": distill.teacher_summary(entries, questions),
        "training": {k: trained[k] for k in ("items", "questions", "saved") if k in trained},
        "held_out": distill.held_out_report(engine, held, entries, questions, args.target_agreement),
    }
    if curve is not None:
        report["learning_curve"] = curve
    (out / "distill.json").write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report), file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


def train_student(student, items, targets, held: tuple, args) -> tuple[dict, list[dict] | None]:
    """The student's head trained on the teacher's distributions of the training rows and saved under --out;
    then, on the same features, the learning curve (`distill.learning_curve`) unless --no-curve."""
    from ..heads import Head
    from ..training import distill
    from ..training import train as training
    from ..training.fitting import extract

    backend = student.backend
    layers = training.default_layers(backend.depth, 1, 0)
    examples = extract(backend, items, layers, targets)
    options = dict(kind=args.kind, model=student.name, rl_weight=0.0, label_weight=0.0)
    trained = training.train_heads(backend, items, targets, layers, out=Path(args.out), examples=examples, **options)
    held_items, held_targets = held
    if args.no_curve or not held_items:
        return trained, None
    held_examples = extract(backend, held_items, layers, held_targets, progress="held-out features")
    final = Head.load(Path(args.out) / "final.json")
    return trained, distill.learning_curve(examples, held_examples, layers, final)


def nothing_taught(teacher_answers: dict, journal: Path) -> str:
    """What to say when the teacher answered none of the training rows: how it failed, and that a rerun goes on."""
    t = teacher_answers
    why = f" ({unanswered_kinds(t)}; the most common: {next(iter(t['errors']))})" if t["errors"] else ""
    return (
        f"prefill distill: the teacher answered none of the training rows{why}; rerun the same command once it "
        f"answers (nothing asked is lost: {journal})"
    )


def unanswered_kinds(teacher_answers: dict) -> str:
    """ "3 timeout, 1 unparseable": the questions the teacher left unanswered, by kind."""
    return ", ".join(f"{n} {kind}" for kind, n in teacher_answers["unanswered_by_kind"].items())


def summary(report: dict) -> str:
    h, t = report["held_out"], report["teacher_answers"]
    if not h.get("questions"):
        return "prefill distill: no held-out question the teacher answered"
    speed = (t["seconds_per_row"] or 0) / max(h["student_seconds_per_row"], 1e-9)
    lines = [
        f"prefill distill: {h['questions']} held-out questions: the student agrees with the teacher on "
        f"{h['agreement']:.1%}, {speed:.1f}x the teacher's speed ({h['student_seconds_per_row']:.3f} vs "
        f"{t['seconds_per_row'] or 0:.3f} s a row); teacher failures: {t['failed_rows']} rows"
    ]
    if t.get("unanswered_questions"):
        lines.append(
            f"  {t['unanswered_questions']} questions the teacher left unanswered ({unanswered_kinds(t)}): rerun "
            "the same command to ask them again"
        )
    if "student_accuracy" in h:
        lines.append(
            f"  gold ({h['gold_questions']} questions): student {h['student_accuracy']:.3f}, "
            f"teacher {h['teacher_accuracy']:.3f}"
        )
    bands = [b for b in h.get("by_teacher_certainty", []) if b["questions"]]
    if bands:
        parts = [
            f"{b['teacher_top_at_least']:.1f}-{b['below']:.1f}: {b['agreement']:.0%} of {b['questions']}" for b in bands
        ]
        lines.append("  agreement by the teacher's certainty (its top answer's probability): " + ", ".join(parts))
    bare = h.get("teacher_choice_only", {})
    if bare.get("questions"):
        lines.append(
            f"  the teacher gave its choice without probabilities on {bare['questions']} of {h['questions']} "
            f"questions (agreement {bare['agreement']:.0%}): its certainty there is unknown, so they are in no band, "
            "and the student learnt them as near-certain (a server that returns logprobs teaches it more)"
        )
    curve = report.get("learning_curve")
    if curve:
        points = ", ".join(f"{c['rows']} rows {c['agreement']:.1%}" for c in curve)
        lines.append(f"  learning curve (the head refitted on part of the training rows; held-out agreement): {points}")
    c = h["cascade_for_target"]
    if c.get("reached", True):
        lines.append(
            f"  cascade: --fallback-below {c['threshold']:.2f} escalates {c['escalated']:.1%} of the "
            f"questions and reaches {c['agreement']:.1%} agreement (target {c['target']:.0%})"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- --student static


def run_static(settings: Settings, args, rows, skipped, train_rows, held, entries, questions, journal) -> int:
    """The static student (training/static.py): its table from --table-from, a head per question on the teacher's
    distributions of the training rows, saved under --out; then, on the held-out rows, the report `prefill
    distill` always gives, the learning curve, and the three-tier cascade (student, --middle, teacher) with the
    thresholds that reach 90 % and 95 % agreement; the one for --target-agreement is saved as the student's
    hand-off threshold (what `prefill serve --readout` uses unless --student-below says otherwise)."""

    from ..static import StaticEngine, StaticStudent
    from ..training import distill, tiers
    from ..training import static as training

    out = Path(args.out)
    taught = training.teacher_rows(train_rows, entries, questions)
    if not taught:
        print(nothing_taught(distill.teacher_summary(entries, questions), journal.path), file=sys.stderr)
        return 1
    table, tokenizer = training.table(args.table_from)
    x = training.features(table, tokenizer, [r.state for r in train_rows])
    heads = training.fit(x, taught)
    name = f"static-{out.resolve().name}"
    teacher = args.teacher or args.teacher_model
    training.save(out, name, table, tokenizer, heads, encoder=args.table_from, teacher=teacher)
    engine = StaticEngine(StaticStudent(out))
    report = {
        "teacher": teacher,
        "student": f"{name} (static, table from {args.table_from})",
        "rows": {"read": len(rows), "unreadable": len(skipped), "train": len(train_rows), "held_out": len(held)},
        "teacher_answers": distill.teacher_summary(entries, questions),
        "training": {
            "questions": [{k: h[k] for k in ("temperature", "penalty", "out_of_fold_agreement")} for h in heads],
            "bytes": engine.student.bytes,
        },
        "held_out": distill.held_out_report(engine, held, entries, questions, args.target_agreement),
    }
    if not args.no_curve:
        x_held = training.features(table, tokenizer, [r.state for r in held])
        held_taught = training.teacher_rows(held, entries, questions)
        report["learning_curve"] = training.curve(x, taught, x_held, held_taught, heads)
    middle = None if args.middle == "none" else args.middle if args.middle != "auto" else settings.model
    if args.middle != "none" and held:
        print("prefill distill: the base model on the held-out rows, for the cascade", file=sys.stderr)
        base = build_prefill(settings.replace(model=middle, readouts=(), fallback_below=None), "distill")
        records = tier_records(engine, base.engine, held, entries, questions)
        teacher_s = (report["teacher_answers"]["seconds_per_row"] or 0) / max(1, len(questions))
        report["cascade_three_tiers"] = {"middle": base.name, **tiers.three_tiers(records, teacher_s)}
    chosen = tiers.hand_off(report, args.target_agreement)
    training.set_hand_off(out, chosen)
    report["hand_off_below"] = chosen
    (out / "distill.json").write_text(json.dumps(report, indent=2) + "\n")
    print(summary(report), file=sys.stderr)
    print(static_summary(report), file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


def tier_records(student, middle, held, entries, questions) -> list[dict]:
    """Each held-out question the teacher answered, as the three-tier cascade sees it (training/tiers.py): the
    student's and the middle tier's answers, and each one's seconds for it."""
    import time

    from ..training import tiers

    records = []
    for row in held:
        probs = (entries.get(row.index) or {}).get("probs") or {}
        asked = {qid: q for qid, q in questions.items() if qid in probs}
        if not asked:
            continue
        started = time.perf_counter()
        mine, _, _ = student.probabilities(row.state, asked)
        static_s = time.perf_counter() - started
        started = time.perf_counter()
        theirs, _, _ = middle.probabilities(row.state, asked)
        middle_s = time.perf_counter() - started
        for qid in asked:
            records.append(
                tiers.tier_record(mine[qid], theirs[qid], probs[qid], static_s / len(asked), middle_s / len(asked))
            )
    return records


def static_summary(report: dict) -> str:
    lines = [f"  the static student: {report['training']['bytes'] / 2**20:.1f} MB"]
    tiers = report.get("cascade_three_tiers")
    if tiers:
        lines.append(f"  three tiers (student, {tiers['middle']}, teacher), on the held-out questions:")
        for t in tiers["targets"]:
            if t.get("reached", True):
                lines.append(
                    f"    {t['target']:.0%} agreement: --student-below {t['student_below']:.2f} --fallback-below "
                    f"{t['middle_below']:.2f}: {t['student']:.0%} / {t['middle']:.0%} / {t['teacher']:.0%} of the "
                    f"questions, {t['agreement']:.1%} agreement, {t['seconds'] * 1000:.1f} ms a question"
                )
            else:
                lines.append(f"    {t['target']:.0%} agreement: not reached without asking the teacher everything")
    return "\n".join(lines)
