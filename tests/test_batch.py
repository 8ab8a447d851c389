"""`prefill batch`: JSONL, CSV and Parquet in and out, answers equal to each row's answer alone, resumed
after an interruption with the same output as an uninterrupted run, bad rows reported by line number."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefill.batch import ERROR_COLUMN, BatchError, Journal, RowFailed, load_questions, run
from prefill.engine import Engine

from .helpers import make_backend, make_model

QUESTIONS = load_questions(
    {
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"Billing": "Invoices", "Technical": None},
        },
        "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Annoyed", "Furious"]},
    }
)
TEXTS = [
    "I was charged twice, refund me.",
    "The app crashes on launch.",
    "Thanks, all good now!",
    "Where is my parcel? It has been a week.",
    "Cancel my subscription today or I call my bank.",
]
ROWS = [{"id": i, "text": TEXTS[i % len(TEXTS)] + f" (ticket {i})"} for i in range(11)]


@pytest.fixture(scope="module")
def engine(tokenizer):
    return Engine(make_backend(make_model("llama", len(tokenizer)), tokenizer))


def write(path, rows):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)


def read(path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    return pq.read_table(path).to_pylist()


class StopsAfter:
    """An engine that is interrupted (Ctrl-C) on its n-th batch, and counts the rows it answers."""

    def __init__(self, engine, n: int | None = None):
        self.engine, self.n, self.calls, self.rows = engine, n, 0, 0

    def decide_many(self, requests):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        self.rows += len(requests)
        return self.engine.decide_many(requests)


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".parquet"])
def test_every_row_answered_as_alone(engine, tmp_path, ext):
    src, out = tmp_path / f"in{ext}", tmp_path / f"out{ext}"
    write(src, ROWS)
    summary = run(engine, src, QUESTIONS, out, state_field="text", batch_size=4, progress=False)
    assert summary.answered == len(ROWS) and not summary.skipped
    got = read(out)
    assert [str(r["id"]) for r in got] == [str(r["id"]) for r in ROWS]  # every row, in order
    for row, r in zip(ROWS, got):
        alone = engine.decide(row["text"], QUESTIONS).answers
        assert abs(float(r["refund"]) - alone["refund"].noul) <= 1e-4
        assert r["team"] == alone["team"].choice
        assert abs(float(r["anger"]) - alone["anger"].score) <= 1e-4
        for name, p in alone["team"].probabilities.items():
            assert abs(float(r[f"team.p.{name}"]) - p) <= 1e-4
        assert abs(float(r["anger.confidence"]) - alone["anger"].confidence) <= 1e-4
    assert not (tmp_path / f"out{ext}.partial.jsonl").exists()


class AnswersAhead(StopsAfter):
    """The same, answering the next group in a thread while the one before is journaled (the static student)."""

    answers_ahead = 1


@pytest.mark.parametrize("ext,stops_after", [(".jsonl", StopsAfter), (".csv", StopsAfter),
                                             (".parquet", StopsAfter), (".jsonl", AnswersAhead)])  # fmt: skip
def test_resumed_after_an_interruption_equals_an_uninterrupted_run(engine, tmp_path, ext, stops_after):
    src = tmp_path / f"in{ext}"
    write(src, ROWS)
    whole = tmp_path / f"whole{ext}"
    run(engine, src, QUESTIONS, whole, state_field="text", batch_size=3, progress=False)
    out = tmp_path / f"out{ext}"
    first = stops_after(engine, n=3)
    with pytest.raises(KeyboardInterrupt):
        run(first, src, QUESTIONS, out, state_field="text", batch_size=3, progress=False)
    assert not out.exists()
    # two batches done, kept; answering ahead, the group after the failed one may have been answered, not kept
    assert first.rows == 6 or (stops_after is AnswersAhead and first.rows == 9)
    second = stops_after(engine)
    summary = run(second, src, QUESTIONS, out, state_field="text", batch_size=3, progress=False)
    assert summary.resumed_from == 6 and second.rows == len(ROWS) - 6  # nothing answered twice
    assert read(out) == read(whole)


def test_a_torn_journal_line_is_cut_and_redone(engine, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, ROWS)
    with pytest.raises(KeyboardInterrupt):
        run(StopsAfter(engine, n=2), src, QUESTIONS, out, state_field="text", batch_size=4, progress=False)
    journal = tmp_path / "out.jsonl.partial.jsonl"
    journal.write_text(journal.read_text() + '{"row": 4, "line": 5, "rec')  # killed mid-write
    run(engine, src, QUESTIONS, out, state_field="text", batch_size=4, progress=False)
    assert [r["id"] for r in read(out)] == list(range(len(ROWS)))


def test_a_jsonl_out_is_the_journals_records_as_written(engine, tmp_path):
    """A JSONL OUT's lines are sliced from the journal, not parsed and dumped again: a text that holds the
    journal's own keys, a row that fails and non-ASCII text come out as the parsed entries would."""
    tricky = [
        {"id": 0, "text": 'a ", "record": {"row": 9}} and \\", "record": x'},
        {"id": 1, "body": "no text field: a row that fails"},
        {"id": 2, "text": "Ça coûte 5 € — refund?\nmerci", "nested": {"record": [1, {"row": 2}]}},
        *ROWS[3:7],
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, tricky)
    with pytest.raises(KeyboardInterrupt):
        run(StopsAfter(engine, n=3), src, QUESTIONS, out, state_field="text", batch_size=2, progress=False)
    journal = Journal(out, src, QUESTIONS)
    parsed = journal.records()
    assert len(parsed) == 4 and [json.loads(t) for t in journal.record_lines()] == parsed
    run(engine, src, QUESTIONS, out, state_field="text", batch_size=2, progress=False)
    got = read(out)
    assert [{k: r[k] for k in row} for r, row in zip(got, tricky)] == tricky  # every row, its fields unchanged
    assert got[:4] == parsed and ERROR_COLUMN in got[1] and "team" in got[2]
    assert out.read_text(encoding="utf-8").splitlines() == [json.dumps(r, ensure_ascii=False) for r in got]


def test_other_questions_do_not_mix_with_a_journal(engine, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, ROWS)
    with pytest.raises(KeyboardInterrupt):
        run(StopsAfter(engine, n=2), src, QUESTIONS, out, state_field="text", batch_size=4, progress=False)
    other = load_questions({"x": {"type": "noul", "instructions": "Is it about a parcel?"}})
    with pytest.raises(BatchError, match="other questions"):
        run(engine, src, other, out, state_field="text", progress=False)


def test_bad_rows_are_reported_by_line_and_kept(engine, tmp_path, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        json.dumps(ROWS[0])
        + "\n"
        + "{not json\n"
        + json.dumps({"id": 2, "body": "no text field"})
        + "\n"
        + json.dumps({"id": 3, "text": 42})
        + "\n"
        + json.dumps(ROWS[4])
        + "\n"
    )
    summary = run(engine, src, QUESTIONS, out, state_field="text", progress=False)
    assert summary.answered == 2 and [line for line, _ in summary.skipped] == [2, 3, 4]
    rows = read(out)
    assert len(rows) == 5  # nothing dropped
    assert [bool(r.get(ERROR_COLUMN)) for r in rows] == [False, True, True, True, False]
    assert "'text'" in rows[2][ERROR_COLUMN] and "int" in rows[3][ERROR_COLUMN]
    with pytest.raises(RowFailed, match=r"in\.jsonl:2: "):
        run(engine, src, QUESTIONS, tmp_path / "stop.jsonl", state_field="text", on_error="stop", progress=False)


def test_a_too_large_row_is_skipped_not_fatal(tokenizer, tmp_path):
    small = Engine(make_backend(make_model("llama", len(tokenizer)), tokenizer), max_sequence_tokens=400)
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    write(src, [{"text": "Short."}, {"text": "refund " * 300}, {"text": "Also short."}])
    summary = run(small, src, QUESTIONS, out, state_field="text", progress=False)
    assert summary.answered == 2 and summary.skipped[0][0] == 3 and "RequestTooLarge" in summary.skipped[0][1]


@pytest.mark.slow
def test_cli_ctrl_c_then_rerun_continues(model_dir, tmp_path):  # noqa: F811
    """The command itself: Ctrl-C mid-job keeps the finished rows (exit 130), the rerun finishes the rest,
    and the result is the uninterrupted run's."""
    rows = [{"id": i, "text": TEXTS[i % len(TEXTS)] + f" ({i})"} for i in range(1500)]  # ~10 s: time to interrupt
    src = tmp_path / "in.jsonl"
    write(src, rows)
    (tmp_path / "q.json").write_text(json.dumps({k: q.model_dump(mode="json") for k, q in QUESTIONS.items()}))

    def batch(out, **kw):
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefill.cli",
                "batch",
                str(src),
                "--model",
                str(model_dir),
                "--questions",
                f"@{tmp_path / 'q.json'}",
                "--out",
                str(out),
                "--state-field",
                "text",
                "--batch-size",
                "1",
            ],
            stderr=subprocess.PIPE,
            text=True,
            # a background job (CI) ignores SIGINT, and so would its children: a terminal's
            # Ctrl-C is what this test plays, so the job gets the default handling back
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            **kw,
        )

    whole = batch(tmp_path / "whole.parquet")
    _, err = whole.communicate(timeout=300)  # communicate, not wait: the progress bar must not fill the pipe
    assert whole.returncode == 0, err
    out = tmp_path / "out.parquet"
    job = batch(out)
    journal = tmp_path / "out.parquet.partial.jsonl"
    deadline = time.monotonic() + 120
    while not (journal.exists() and journal.stat().st_size > 1000):  # a few rows done
        assert time.monotonic() < deadline and job.poll() is None, "the job ended before it could be interrupted"
        time.sleep(0.01)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 130 and "rerun the same command" in err
    assert not out.exists()
    rerun = batch(out)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert "continued after" in err and "rows answered" in err and "%" in err  # the summary and the progress bar
    assert read(out) == read(tmp_path / "whole.parquet")


@pytest.mark.slow
def test_ray_data_over_1000_records_equals_one_process_and_resumes(model_dir, tmp_path):  # noqa: F811
    """`prefill batch --ray`: 1,000 records over two engine actors (a local Ray started by the command) give
    the single-process output exactly, in order; and a job begun in one process is finished on Ray."""
    from prefill.api import Prefill

    rows = [{"id": i, "text": TEXTS[i % len(TEXTS)] + f" (order {i})"} for i in range(1000)]
    rows[500] = {"id": 500}  # a bad row, reported the same way on both
    src = tmp_path / "in.jsonl"
    write(src, rows)
    (tmp_path / "q.json").write_text(json.dumps({k: q.model_dump(mode="json") for k, q in QUESTIONS.items()}))

    def batch(out, *extra):
        run_ = subprocess.run(
            [
                sys.executable,
                "-m",
                "prefill.cli",
                "batch",
                str(src),
                "--model",
                str(model_dir),
                "--questions",
                f"@{tmp_path / 'q.json'}",
                "--out",
                str(out),
                "--state-field",
                "text",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run_.returncode == 0, run_.stderr[-3000:]
        return run_.stderr

    batch(tmp_path / "one.jsonl")
    err = batch(tmp_path / "ray.jsonl", "--ray", "--ray-actors", "2")
    assert "1 skipped (lines 501;" in err
    assert read(tmp_path / "ray.jsonl") == read(tmp_path / "one.jsonl")
    begun = tmp_path / "begun.jsonl"
    with pytest.raises(KeyboardInterrupt):  # 3 groups done in this process, then Ctrl-C
        run(StopsAfter(Prefill(str(model_dir)).engine, n=4), src, QUESTIONS, begun, state_field="text", progress=False)
    assert "continued after 48 rows" in batch(begun, "--ray")
    assert read(begun) == read(tmp_path / "one.jsonl")
