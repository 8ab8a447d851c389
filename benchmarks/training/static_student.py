"""The static student against the teacher, the EmbeddingGemma student and a training-free static peer, on real tasks
(benchmarks/quality/tasks.py's data): `prefill distill --student static` on each task's rows (the teacher answers
every row once, journaled; the EmbeddingGemma student is trained on the same journal), then, on the held-out rows,
each one's agreement with the teacher, accuracy against gold, seconds a question (p50 and p99, one core, in
process), memory, and the static student's rows a second through `prefill batch` (2 cores); and sparrow-decider
0.2.0 (Apache-2.0, numpy only: a general static-embedding decision model distilled from a 4B teacher), asked the
same questions about the same held-out rows, training-free.

    python -m benchmarks.training.static_student --out out/static                 # ~2 h on 2 cores
    python -m benchmarks.training.static_student --out out/static --report        # the table again
    python -m benchmarks.training.static_student --out out/static --measure       # the students measured again
    python -m benchmarks.training.static_student --out out/static --tasks language --rows 120 --no-egemma  # smoke
    python -m benchmarks.training.static_student --out out/static-1600 --tasks emails:spam --rows 1600 --no-egemma

A task is asked its usual question (distill_tasks.ASKED), or another of its phrasings as task:qid (emails:spam).

Every step says what it does and how far it is; a rerun reuses the teacher's journals (`prefill distill` resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.training.distill_tasks import write_task

# emails:spam: the e-mails asked "Is this email spam?" (yes/no), the way users ask it most, beside the choice.
TASKS = ("lists", "packages", "language", "emails", "emails:spam")
TEACHER = "qwen2.5-coder-1.5b-instruct"
MIDDLE = "qwen2.5-coder-0.5b-instruct"


def distill(task: str, folder: Path, data: Path, q: Path, *extra: str) -> None:
    command = [sys.executable, "-m", "prefill.cli", "distill", str(data), "--questions", f"@{q}"]
    command += ["--state-field", "text", "--gold-field", "gold", "--teacher-model", TEACHER, "--out", str(folder)]
    print(f"  prefill distill {' '.join(extra)} -> {folder}", file=sys.stderr, flush=True)
    subprocess.run([*command, *extra], check=True, stdout=subprocess.DEVNULL)


def held_out(folder: Path):
    from prefill.batch import load_questions
    from prefill.training import distill as training

    questions = load_questions(json.loads((folder / "questions.json").read_text()))
    rows, _ = training.read_distill_rows(folder / "rows.jsonl", questions, "text", "gold")
    _, held = training.split(rows, 0.2, 0)
    entries = training.Journal(folder / "static" / "teacher.jsonl", questions).entries()
    return questions, held, entries


def timed(engine_probabilities, held, questions) -> list[float]:
    """Seconds a question, each held-out row asked alone, after one warm-up."""
    engine_probabilities(held[0].state, questions)
    out = []
    for row in held:
        started = time.perf_counter()
        engine_probabilities(row.state, questions)
        out.append((time.perf_counter() - started) / len(questions))
    return out


def scores(answer_of, held, entries, questions) -> dict:
    from prefill.evaluation.evaluate import gold_index
    from prefill.evaluation.metrics import argmax

    agree = right = gold = n = 0
    parted = {"questions": 0, "student_right": 0, "teacher_right": 0}  # where the two part, who is right (gold)
    for row in held:
        teacher = (entries.get(row.index) or {}).get("probs") or {}
        mine = answer_of(row.state)
        for qid, q in questions.items():
            if qid not in teacher or qid not in mine:
                continue
            n += 1
            agree += argmax(mine[qid]) == argmax(teacher[qid])
            if row.gold.get(qid) is not None:
                gold += 1
                truth = gold_index(q, row.gold[qid])
                right += argmax(mine[qid]) == truth
                if argmax(mine[qid]) != argmax(teacher[qid]):
                    parted["questions"] += 1
                    parted["student_right"] += argmax(mine[qid]) == truth
                    parted["teacher_right"] += argmax(teacher[qid]) == truth
    return {
        "questions": n,
        "agreement": agree / n if n else None,
        "accuracy": right / gold if gold else None,
        "parted": parted,
    }


def sparrow(questions):
    """sparrow-decider's answers as distributions in the question's declared order (None: not installed)."""
    try:
        from sparrow_decider import Decider
    except ImportError:
        return None
    from prefill.schema import answer_labels

    decider = Decider.load()
    wire = {qid: peer_question(q.model_dump(mode="json", exclude_none=True)) for qid, q in questions.items()}

    def answer_of(state):
        got = decider.ask(state if isinstance(state, str) else json.dumps(state), wire)
        out = {}
        for qid, q in questions.items():
            a = got[qid] if isinstance(got, dict) else getattr(got, qid)
            a = a if isinstance(a, dict) else a.__dict__
            if q.type == "noul":
                out[qid] = [a["noul"], 1 - a["noul"]]
            else:
                out[qid] = [a["probabilities"][name] for name in answer_labels(q)]
        return out

    return answer_of


def peer_question(q: dict) -> dict:
    """A question as sparrow-decider reads it: a choice's criteria as {name: description}, a yes/no one's as
    {"true": ..., "false": ...}."""
    criteria = q.get("criteria")
    if q["type"] == "choice" and isinstance(criteria, list):
        q["criteria"] = {name: name for name in criteria}
    if q["type"] == "noul" and isinstance(criteria, dict):
        q["criteria"] = {"true": criteria.get("yes", "yes"), "false": criteria.get("no", "no")}
    return q


def measure(folder: Path, egemma: bool) -> dict:
    import torch

    from prefill import Prefill
    from prefill.static import StaticEngine, StaticStudent

    torch.set_num_threads(1)  # one core, in process
    questions, held, entries = held_out(folder)
    result: dict = {"task": folder.name, "held_out_rows": len(held)}
    teacher_json = json.loads((folder / "static" / "distill.json").read_text())
    result["teacher"] = {
        **scores(
            lambda s: {q: (entries.get(_row(held, s)) or {}).get("probs", {}).get(q) for q in questions},
            held,
            entries,
            questions,
        ),  # fmt: skip
        "seconds_per_question": (teacher_json["teacher_answers"]["seconds_per_row"] or 0) / len(questions),
    }
    student = StaticEngine(StaticStudent(folder / "static"))
    latency = timed(student.probabilities, held, questions)
    result["static"] = {
        **scores(lambda s: student.probabilities(s, questions)[0], held, entries, questions),
        "p50_ms": 1000 * statistics.median(latency),
        "p99_ms": 1000 * sorted(latency)[min(len(latency) - 1, int(0.99 * len(latency)))],
        "bytes": student.student.bytes,
        "cascade": teacher_json.get("cascade_three_tiers"),
        "hand_off_below": teacher_json.get("hand_off_below"),
    }
    if egemma and (folder / "egemma" / "final.json").is_file():
        pf = Prefill(model="embeddinggemma-300m", readout=folder / "egemma", dtype="float32")
        latency = timed(lambda s, q: pf.engine.probabilities(s, q), held, questions)
        result["egemma"] = {
            **scores(lambda s: pf.engine.probabilities(s, questions)[0], held, entries, questions),
            "p50_ms": 1000 * statistics.median(latency),
            "p99_ms": 1000 * sorted(latency)[min(len(latency) - 1, int(0.99 * len(latency)))],
            "bytes": sum(p.numel() * p.element_size() for p in pf.backend.model.parameters()),
        }
    peer = sparrow(questions)
    if peer is not None:
        latency = timed(lambda s, q: peer(s), held, questions)
        result["sparrow"] = {
            **scores(peer, held, entries, questions),
            "p50_ms": 1000 * statistics.median(latency),
            "p99_ms": 1000 * sorted(latency)[min(len(latency) - 1, int(0.99 * len(latency)))],
        }
    result["batch_rows_per_second"] = batch_rate(folder)
    return result


def _row(held, state) -> int:
    return next(r.index for r in held if r.state == state)


def batch_seconds(data: Path, questions: Path, student: Path, out: Path, code: Path | None = None) -> float:
    """Seconds `prefill batch` takes over `data` with the static student alone (`--student-below 0`), on 2 cores,
    the process's start included; `code`: another checkout of prefill to run instead."""
    out.unlink(missing_ok=True)  # measured again: prefill batch refuses to overwrite a finished output
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "prefill.cli", "batch", str(data), "--questions", f"@{questions}", "--state-field",
         "text", "--readout", str(student), "--student-below", "0", "--out", str(out)],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=code,  # -m puts the cwd first
        env={**os.environ, "OMP_NUM_THREADS": "2", **({"PYTHONPATH": str(code)} if code else {})},
    )  # fmt: skip
    return time.perf_counter() - started


def batch_rate(folder: Path, rows_at_least: int = 100_000) -> dict:
    """`prefill batch --readout --student-below 0` with the static student over the task's rows (repeated to
    `rows_at_least`), 2 cores: rows a second, the process's start and load included, and the start alone (the
    same command on one row). The student answers alone: no model is loaded (commands/batch.py `static_alone`)."""
    rows = (folder / "rows.jsonl").read_text().splitlines()
    seconds = {}
    for label, copies in (("one row", None), ("all", -(-rows_at_least // len(rows)))):
        data, out = folder / "batch-rows.jsonl", folder / "batch-out.jsonl"
        data.write_text("\n".join(rows[:1] if copies is None else rows * copies) + "\n")
        n = sum(1 for _ in open(data))
        print(f"  prefill batch: {label} ({n} rows)", file=sys.stderr, flush=True)
        seconds[label] = batch_seconds(data, folder / "questions.json", folder / "static", out)
        data.unlink()
    return {"rows": n, "rows_per_second": n / seconds["all"], "start_seconds": seconds["one row"],
            "answering_rows_per_second": n / max(1e-9, seconds["all"] - seconds["one row"])}  # fmt: skip


def table(results: list[dict]) -> str:
    lines = [
        "| task | who | agreement with the teacher | accuracy (gold) | where it parts from the teacher: it / "
        "the teacher right | seconds a question: p50 / p99 | memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["teacher"]
        lines.append(f"| {r['task']} | teacher (1.5B, bf16) | - | {t['accuracy']:.3f} | - | "
                     f"{t['seconds_per_question']:.2f} s (mean, 2 cores) | 3.3 GiB (bf16 weights) |")  # fmt: skip
        for who, label in (("egemma", "EmbeddingGemma student"), ("static", "static student"),
                           ("sparrow", "sparrow-decider 0.2.0 (training-free)")):  # fmt: skip
            if who not in r:
                continue
            s = r[who]
            memory = f"{s['bytes'] / 2**20:.1f} MB" if "bytes" in s else "2.2 MB (its model)"
            p = s.get("parted") or {}
            parted = f"{p['student_right']} / {p['teacher_right']} of {p['questions']}" if p else ""
            lines.append(f"| {r['task']} | {label} | {s['agreement']:.3f} | {s['accuracy']:.3f} | {parted} | "
                         f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f} ms (one core) | {memory} |")  # fmt: skip
    lines.append("")
    lines.append("| task | static student in `prefill batch` (2 cores) | three tiers for 90 % | for 95 % |")
    lines.append("|---|---|---|---|")
    for r in results:
        cells = []
        for target in (0.9, 0.95):
            tiers = (r["static"].get("cascade") or {}).get("targets", [])
            t = next((x for x in tiers if abs(x["target"] - target) < 1e-9), None)
            if not t or not t.get("reached", True):
                cells.append("not reached")
            else:
                cells.append(f"{t['student']:.0%} / {t['middle']:.0%} / {t['teacher']:.0%}, {t['agreement']:.1%}, "
                             f"{t['seconds'] * 1000:.0f} ms a question")  # fmt: skip
        rate = r["batch_rows_per_second"]
        if isinstance(rate, dict):  # an earlier run's is a number: rows a second, start included
            after = f"{rate['answering_rows_per_second']:.0f} after its {rate['start_seconds']:.1f} s start"
            rate = f"{rate['rows_per_second']:.0f} rows/s over {rate['rows']:,} rows ({after})"
        else:
            rate = f"{rate:.0f} rows/s"
        lines.append(f"| {r['task']} | {rate} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--no-egemma", action="store_true", help="skip the EmbeddingGemma student")
    ap.add_argument("--report", action="store_true", help="print the table of an earlier run")
    ap.add_argument("--measure", action="store_true", help="measure the students of an earlier run again")
    args = ap.parse_args(argv)
    out = Path(args.out)
    tasks = args.tasks.split(",")
    if not args.report:
        for i, task in enumerate(tasks, 1):
            folder = out / task
            print(f"[{i}/{len(tasks)}] {task}: {args.rows} rows", file=sys.stderr, flush=True)
            data, q = write_task(task, args.rows, 0, folder)
            if not args.measure:
                distill(task, folder / "static", data, q, "--student", "static", "--middle", MIDDLE)
            if not args.no_egemma and not args.measure:
                (folder / "egemma").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / "static" / "teacher.jsonl", folder / "egemma" / "teacher.jsonl")
                distill(task, folder / "egemma", data, q, "--model", "embeddinggemma-300m", "--kind", "classes")
            result = measure(folder, not args.no_egemma)
            result["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            (folder / "result.json").write_text(json.dumps(result, indent=1))
    print(table([json.loads((out / t / "result.json").read_text()) for t in tasks]))


if __name__ == "__main__":
    main()
