"""`prefill distill` on real tasks (benchmarks/quality/tasks.py's data): each task's texts written as unlabelled rows
(the gold label in a field the student never trains on), one question a task, the teacher a bigger model, the
student a fast one; then the held-out reports side by side.

    # the teacher: Qwen2.5-Coder-1.5B through prefill; the student: all-MiniLM-L6-v2 with a head (encoder route)
    python -m benchmarks.training.distill_tasks --teacher-model qwen2.5-coder-1.5b-instruct --model all-minilm-l6-v2 \\
        --out out/distill
    # the teacher: llama.cpp's server on the 1.5B GGUF (OpenAI-compatible), started here; the student
    # EmbeddingGemma with a head (docs/measurements/distillation.md: the worked example)
    python -m benchmarks.training.distill_tasks --llama-server --tasks language,emails --rows 240 \\
        --model embeddinggemma-300m --out out/distill-llamacpp
    python -m benchmarks.training.distill_tasks --llama-server --tasks lists --rows 180 \\
        --model embeddinggemma-300m --out out/distill-llamacpp
    python -m benchmarks.training.distill_tasks --report out/distill out/distill-llamacpp
    # the teacher's seconds a row measured alone, on the first rows a run wrote (when its journal's timings
    # shared the CPU with something else)
    python -m benchmarks.training.distill_tasks --time-teacher 8 --teacher-model qwen2.5-coder-1.5b-instruct \
        --tasks language,emails --out out/distill-15b
    # ... and the student a run trained, on the same rows in turn: the speed-up as a ratio within one run
    python -m benchmarks.training.distill_tasks --time-teacher 40 --teacher-model qwen2.5-coder-1.5b-instruct \
        --model embeddinggemma-300m --tasks conditions --out out/distill-cond
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from benchmarks.quality.suite import TASKS, items

# One question a task: the form a user would ask it in.
ASKED = {
    "language": "which",
    "spam": "kind",
    "emails": "kind",
    "lists": "route",
    "fr_reviews": "sentiment",
    "drugs": "opinion",
    "conditions": "clinic",
    "packages": "section",
}


def write_task(name: str, rows: int, seed: int, folder: Path, unlabelled: bool = False) -> tuple[Path, Path]:
    """rows.jsonl ({text, gold}) and questions.json for one task, as many texts of each label; `unlabelled`:
    with the task's texts that carry none of its labels mixed in (gold null), as a user's rows would come.
    `name`: a task, asked its question in ASKED, or "task:qid" for another of its phrasings (emails:spam)."""
    name, _, qid = name.partition(":")
    task = TASKS[name]
    phrasing = next(p for p in task.phrasings if p.qid == (qid or ASKED[name]))
    folder.mkdir(parents=True, exist_ok=True)
    data, q = folder / "rows.jsonl", folder / "questions.json"
    records = []
    for text, asked in items(task, rows, seed):
        gold = next(a.gold for a in asked if a.qid == phrasing.qid)
        records.append({"text": text, "gold": _label(phrasing.question, gold)})
    if unlabelled:
        if task.unlabelled is None:
            raise SystemExit(f"--unlabelled: the task {name} has no unlabelled texts")
        records += [{"text": text, "gold": None} for text in task.unlabelled()]
        random.Random(f"{name}:{seed}:unlabelled").shuffle(records)
    with open(data, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    from prefill.evaluation.evaluate import parse_questions

    wire = parse_questions({phrasing.qid: phrasing.question})[phrasing.qid].model_dump(mode="json")
    q.write_text(json.dumps({phrasing.qid: wire}, ensure_ascii=False))
    return data, q


def _label(question: dict, index: int):
    criteria = question.get("criteria")
    if question["type"] == "noul":
        return index == 0
    if question["type"] == "choice":
        return list(criteria)[index]
    return index


def run(args) -> None:
    teacher = ["--teacher-model", args.teacher_model] if args.teacher_model else []
    server = None
    if args.llama_server:
        server, teacher = llama_teacher(args)
    try:
        for name in args.tasks.split(","):
            folder = Path(args.out) / name
            data, q = write_task(name, args.rows, args.seed, folder, args.unlabelled)
            print(f"distilling {name} ({args.rows} rows) into {folder} ...", file=sys.stderr, flush=True)
            command = [
                sys.executable,
                "-m",
                "prefill.cli",
                "distill",
                str(data),
                "--questions",
                f"@{q}",
                "--state-field",
                "text",
                "--gold-field",
                "gold",
                "--out",
                str(folder),
                *teacher,
            ]
            command += ["--model", args.model] if args.model else []
            command += ["--dtype", args.dtype, "--kind", args.kind]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    finally:
        if server is not None:
            server.__exit__()
    report([Path(args.out)])


def llama_teacher(args):
    """llama.cpp's server on the 1.5B GGUF, as an OpenAI-compatible teacher (one request at a time)."""
    import torch

    from prefill.bench.generation import LlamaServer, llama_server_binary
    from prefill.loading import resolve

    gguf = resolve("qwen2.5-coder-1.5b-instruct").location
    server = LlamaServer(llama_server_binary(), gguf, torch.get_num_threads()).__enter__()
    url = f"http://127.0.0.1:{server.port}"
    return server, ["--teacher", url, "--teacher-kind", "openai", "--teacher-model", "qwen", "--concurrency", "1"]


def report(outs: list[Path]) -> None:
    print(
        "| run | task | held-out questions | agreement with the teacher | student / teacher accuracy (gold) | "
        "seconds a row: student / teacher (speed-up) | cascade: escalated for 95 % agreement | for 90 % | "
        "student's log loss vs the teacher | agreement where the teacher's top answer has p < 0.5 / 0.5-0.7 / "
        "0.7-0.9 / >= 0.9 (questions) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for out in outs:
        for path in sorted(out.glob("*/distill.json")):
            r = json.loads(path.read_text())
            h, t = r["held_out"], r["teacher_answers"]
            speed = t["seconds_per_row"] / h["student_seconds_per_row"]
            c = h["cascade_for_target"]
            cascade = f"{c['escalated']:.0%} (threshold {c['threshold']:.2f})" if "escalated" in c else "not reached"
            ninety = next((p for p in h.get("cascade", []) if p["agreement"] >= 0.9), None)
            at_90 = "-"
            if ninety:
                at_90 = f"{ninety['escalated']:.0%} ({ninety['agreement']:.3f} at {ninety['threshold']:.2f})"
            print(
                f"| {out.name} | {path.parent.name} | {h['questions']} | {h['agreement']:.3f} | "
                f"{h.get('student_accuracy', float('nan')):.3f} / {h.get('teacher_accuracy', float('nan')):.3f} | "
                f"{h['student_seconds_per_row']:.3f} / {t['seconds_per_row']:.3f} ({speed:.0f}x) | {cascade} | "
                f"{at_90} | {h.get('log_loss_vs_teacher', float('nan')):.3f} | {bands(h)} |"
            )


def bands(held_out: dict) -> str:
    """The held-out agreement within bands of the teacher's certainty ("-" for a run from before them)."""
    found = held_out.get("by_teacher_certainty")
    if not found:
        return "-"
    cell = " / ".join("-" if b["agreement"] is None else f"{b['agreement']:.2f} ({b['questions']})" for b in found)
    bare = held_out.get("teacher_choice_only") or {}
    if bare.get("questions"):
        cell += f"; no probabilities: {bare['agreement']:.2f} ({bare['questions']})"
    return cell


def time_teacher(args) -> None:
    """The call `prefill distill` makes of a teacher prefill loads (Engine.probabilities on the row's state and
    the task's question), timed on the first `--time-teacher` rows of each task's rows.jsonl, after one
    warm-up row. With `--model`, the student the run trained (the task folder's readout) is timed on the same
    rows, row by row in turn with the teacher, so the speed-up is a ratio within one run: a run's own columns
    compare the student's pass with the teacher's journal, written minutes or hours earlier on a machine whose
    speed moves between hours (docs/measurements/distillation.md)."""
    import statistics
    import time

    from prefill.api import Prefill
    from prefill.batch import load_questions
    from prefill.training import distill

    teacher = Prefill(model=args.teacher_model, dtype=args.dtype).engine
    for task in args.tasks.split(","):
        folder = Path(args.out) / task
        questions = load_questions(json.loads((folder / "questions.json").read_text()))
        rows, _ = distill.read_distill_rows(folder / "rows.jsonl", questions, "text", "gold")
        engines = {"teacher": teacher}
        if args.model:
            engines["student"] = Prefill(model=args.model, readout=folder, dtype=args.dtype).engine
        seconds: dict[str, list[float]] = {who: [] for who in engines}
        for engine in engines.values():  # warm-up
            engine.probabilities(rows[-1].state, questions)
        for row in rows[: args.time_teacher]:
            for who, engine in engines.items():
                started = time.perf_counter()
                engine.probabilities(row.state, questions)
                seconds[who].append(time.perf_counter() - started)
            print(
                f"{task}: row {row.index}: " + ", ".join(f"{w} {s[-1]:.3f} s" for w, s in seconds.items()),
                file=sys.stderr,
            )
        for who, s in seconds.items():
            print(
                f"{task}: the {who} alone, {statistics.mean(s):.3f} s a row on average "
                f"(median {statistics.median(s):.3f}) over {len(s)} rows"
            )
        if "student" in seconds:
            ratio = statistics.mean(seconds["teacher"]) / statistics.mean(seconds["student"])
            print(f"{task}: the student {ratio:.1f}x the teacher's speed, the same rows in turn")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="language,spam,fr_reviews")
    ap.add_argument(
        "--rows",
        type=int,
        default=240,
        help="texts a task, as many of each label (all of a label's where it has fewer)",
    )
    ap.add_argument("--seed", type=int, default=1, help="1: other texts than the suite's (seed 0)")
    ap.add_argument(
        "--unlabelled",
        action="store_true",
        help="mix in the task's texts that carry none of its labels (conditions: the other conditions' reviews)",
    )
    ap.add_argument("--teacher-model", default=None, help="a model prefill loads as the teacher")
    ap.add_argument("--llama-server", action="store_true", help="the teacher: llama.cpp's server on the 1.5B GGUF")
    ap.add_argument("--model", default=None, help="the student (prefill's --model)")
    ap.add_argument("--kind", default="auto", help="the student's head (prefill distill --kind)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", nargs="+", default=None, help="only print the table of saved runs")
    ap.add_argument(
        "--time-teacher",
        type=int,
        default=0,
        help="only time the teacher alone on this many rows (with --model: the student too, in turn)",
    )
    args = ap.parse_args()
    if args.report:
        report([Path(p) for p in args.report])
    elif args.time_teacher:
        time_teacher(args)
    elif not args.out or not (args.teacher_model or args.llama_server):
        ap.error("--out and a teacher (--teacher-model or --llama-server) are needed to run")
    else:
        run(args)


if __name__ == "__main__":
    main()
