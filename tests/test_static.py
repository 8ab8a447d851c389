"""The static student (prefill/static.py, prefill/training/static.py): built from a tiny encoder's table and a fake
teacher's answers, it learns the teacher's rule, answers the same bits packed or alone, in a batch or alone, under
any id and with its options in any order, in process and over HTTP; a question it was not taught is refused with a
message that says what it knows, or handed to the base model behind it; `prefill distill --student static` runs end
to end, resumes an interrupted journal, and its folder is what `prefill serve --readout` and `prefill batch` take."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prefill.backends.base import ReadoutUnsupported
from prefill.schema import Choice, Noul, Score
from prefill.static import StaticEngine, StaticStudent, is_static, signature
from prefill.training import distill, tiers
from prefill.training import static as training

from .helpers import make_model, tiny_bert

WORDS = {
    "billing": ["refund", "charged", "invoice"],
    "bug": ["crash", "error", "broken"],
    "praise": ["thanks", "great"],
}
QUESTIONS = {
    "kind": Choice("Which kind?", {"billing": "money", "bug": "a fault", "praise": "thanks"}),
    "urgent": Noul("Is it urgent?"),
    "mood": Score("How upset?", ["calm", "upset", "furious"]),
}


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = list(WORDS)[i % 3]
        out.append(" ".join(rng.choice(WORDS[kind], 3)) + f" ticket {i} " + " ".join(rng.choice(["the", "a"], 2)))
    return out


def teacher(text: str) -> dict[str, list[float]]:
    """The rule the fake teacher answers by: the kind its words say; urgent when broken; upset with the kind."""
    kind = next(k for k, words in WORDS.items() if any(w in text for w in words))
    k = list(WORDS).index(kind)
    return {
        "kind": [0.8 if i == k else 0.1 for i in range(3)],
        "urgent": [0.85, 0.15] if "broken" in text or "crash" in text else [0.2, 0.8],
        "mood": [[0.1, 0.3, 0.6], [0.2, 0.6, 0.2], [0.8, 0.15, 0.05]][k],
    }


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("tiny-bert")
    tiny_bert(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def student(tmp_path_factory, encoder) -> Path:
    rows = [distill.Row(i, i + 1, t, {}) for i, t in enumerate(texts(90))]
    entries = {r.index: {"probs": teacher(r.state)} for r in rows}
    table, tokenizer_file = training.table(str(encoder))
    x = training.features(table, tokenizer_file, [r.state for r in rows])
    heads = training.fit(x, training.teacher_rows(rows, entries, QUESTIONS), progress=False)
    out = tmp_path_factory.mktemp("student")
    training.save(out, "static-test", table, tokenizer_file, heads)
    return out


def flat(answer) -> list[float]:
    return [answer.noul] if answer.type == "noul" else list(answer.probabilities.values())


def test_it_learns_the_teachers_rule_on_rows_it_never_saw(student):
    engine = StaticEngine(StaticStudent(student))
    unseen = texts(30, seed=7)
    agree = sum(
        int(np.argmax(engine.probabilities(t, QUESTIONS)[0][q])) == int(np.argmax(teacher(t)[q]))
        for t in unseen
        for q in QUESTIONS
    )
    assert agree / (len(unseen) * len(QUESTIONS)) >= 0.9
    assert is_static(student) and json.loads((student / "static.json").read_text())["questions"][0]["temperature"] > 0


def test_the_same_bits_packed_alone_batched_renamed_and_reordered(student):
    engine = StaticEngine(StaticStudent(student))
    state = "my invoice was charged twice and the app is broken"
    together = engine.ask(state, QUESTIONS)[0]
    for qid, q in QUESTIONS.items():
        assert engine.ask(state, {f"renamed {qid}": q})[0][f"renamed {qid}"] == together[qid]
    swapped = Choice("Which kind?", dict(reversed(list(QUESTIONS["kind"].criteria.items()))))
    alone = engine.ask(state, {"k": swapped})[0]["k"]
    assert alone.probabilities == together["kind"].probabilities and list(alone.probabilities)[0] == "praise"
    batched = engine.decide_many([("thanks, great", QUESTIONS, None), (state, QUESTIONS, None)])[1]
    assert batched.answers == together


def test_a_question_it_was_not_taught_is_refused_saying_what_it_knows(student):
    engine = StaticEngine(StaticStudent(student))
    with pytest.raises(ReadoutUnsupported, match="answers only the questions it was taught.*'Which kind\\?'"):
        engine.ask("a crash", {"spam": Noul("Is this spam?")})
    other_options = Choice("Which kind?", ["billing", "bug"])  # the same words, other answers: another question
    assert signature(other_options) != signature(QUESTIONS["kind"])
    with pytest.raises(ReadoutUnsupported):
        engine.ask("a crash", {"kind": other_options})


class NextTier:
    """A base model behind the student: answers yes / the first option, and records what it was asked."""

    name = "base"

    def __init__(self):
        self.asked: list[set[str]] = []

    def probabilities(self, state, questions, reference_date=None):
        self.asked.append(set(questions))
        return {q: [1.0] + [0.0] * (len(questions[q].criteria or [0]) if q != "spam" else 1) for q in questions}, 7, []


def test_what_it_was_not_taught_or_is_unsure_of_goes_to_the_next_tier(student):
    nxt = NextTier()
    engine = StaticEngine(StaticStudent(student), fallback=nxt, hand_off_below=None)
    d = engine.decide("a crash", {"kind": QUESTIONS["kind"], "spam": Noul("Is this spam?")})
    assert nxt.asked == [{"spam"}] and d.escalated == ["spam"] and d.answers["spam"].noul == 1.0
    assert d.usage.input_tokens > 7  # the student's tokens and the base model's
    unsure = StaticEngine(StaticStudent(student), fallback=nxt, hand_off_below=1.01)  # unsure of everything
    assert set(unsure.decide("a crash", {"kind": QUESTIONS["kind"]}).escalated) == {"kind"}


def test_a_rows_features_are_the_same_bits_whatever_rows_are_read_with_it(student):
    reader = StaticStudent(student)
    texts_ = ["Héllo héllo, my invoice", "", "a", "the app crashes when I open it " * 40, "ok"]
    together = reader.features(texts_)
    assert together.tokens[1] == 0 and not together.meaning[1].any() and together.starts[1] == together.starts[2]
    for i, text in enumerate(texts_):
        for company in ([text], [text, *texts_], [*reversed(texts_), text]):
            alone = reader.features(company)
            j = company.index(text)
            assert np.array_equal(alone.meaning[j], together.meaning[i])
            s, e = alone.starts[j : j + 2]
            assert np.array_equal(alone.buckets[s:e], together.buckets[together.starts[i] : together.starts[i + 1]])
            assert np.array_equal(alone.values[s:e], together.values[together.starts[i] : together.starts[i + 1]])
    s, e = together.starts[0:2]
    assert np.all(np.diff(together.buckets[s:e]) > 0) and abs(float(np.linalg.norm(together.values[s:e])) - 1) < 1e-6
    dense = together.dense()
    assert np.array_equal(dense[3, : together.meaning.shape[1]], together.meaning[3]) and not dense[1].any()


def test_three_tiers_cascade_as_defined():
    records = [
        tiers.tier_record([0.9, 0.1], [0.9, 0.1], [1.0, 0.0], 0.001, 0.1),  # student sure and right
        tiers.tier_record([0.55, 0.45], [0.2, 0.8], [0.0, 1.0], 0.001, 0.1),  # student unsure and wrong, middle right
        tiers.tier_record([0.5, 0.5], [0.6, 0.4], [0.0, 1.0], 0.001, 0.1),  # both unsure and wrong
    ]
    found = tiers.three_tiers(records, teacher_seconds=2.0, steps=10, targets=(0.6, 1.0))
    assert found["alone"]["student"] == pytest.approx(1 / 3) and found["alone"]["middle"] == pytest.approx(2 / 3)
    cheapest_60, all_right = found["targets"]
    assert cheapest_60["agreement"] >= 0.6 and cheapest_60["teacher"] == 0  # reached without the teacher
    assert all_right["agreement"] == 1.0 and all_right["teacher"] == pytest.approx(1 / 3)
    assert all_right["seconds"] == pytest.approx(0.001 + (0.1 * 2) / 3 + 2.0 / 3)


class FakeSystemOne:
    """A System One server in a thread, answering by the fake teacher's rule; `asked` has every state asked."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from prefill.engine import wire_answer
        from prefill.schema import SystemOneRequest

        self.asked: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                request = SystemOneRequest.model_validate_json(self.rfile.read(int(self.headers["content-length"])))
                fake.asked.append(request.state)
                rule = teacher(request.state)
                answers = {
                    qid: wire_answer(q, rule[qid]).model_dump(mode="json", exclude_none=True)
                    for qid, q in request.questions.items()
                }
                data = json.dumps({"model": "fake", "answers": answers, "usage": {"input_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_distill_static_end_to_end_resumed_then_served_over_http_and_in_batch(tokenizer, encoder, tmp_path):
    """A System One server as the teacher; the run interrupted (half its journal lost) and rerun: only what was
    missing is asked again, and the student comes out the same; served by `prefill serve --readout` it gives over
    HTTP the bits it gives in process; `prefill batch --readout` reads it."""
    from prefill import Prefill
    from prefill.bench.http import in_thread
    from prefill.serving.app import create_app

    model = tmp_path / "tiny"
    make_model("llama", len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    data, q = tmp_path / "rows.jsonl", tmp_path / "questions.json"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40)))
    q.write_text(json.dumps({k: v.model_dump(mode="json", exclude_none=True) for k, v in QUESTIONS.items()}))
    out = tmp_path / "student"
    command = [sys.executable, "-m", "prefill.cli", "distill", str(data), "--questions", f"@{q}", "--state-field"]
    command += ["text", "--student", "static", "--table-from", str(encoder), "--middle", "none", "--out", str(out)]
    fake = FakeSystemOne()
    try:
        command += ["--teacher", fake.url, "--teacher-kind", "systemone", "--model", str(model)]
        first = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stderr
        assert len(fake.asked) == 40
        journal = (out / "teacher.jsonl").read_text().splitlines()
        (out / "teacher.jsonl").write_text("\n".join(journal[:21]) + "\n")  # interrupted: 20 of 40 rows kept
        again = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr
        assert len(fake.asked) == 60  # only the rows the journal lost were asked again
    finally:
        fake.close()
    report = json.loads((out / "distill.json").read_text())
    assert report["held_out"]["questions"] == 24 and report["held_out"]["agreement"] >= 0.75
    assert "static" in report["student"] and is_static(out)
    served = Prefill(str(model), readout=str(out))
    state = "refund please, the app is broken"
    in_process = served.engine.ask(state, QUESTIONS)[0]
    with in_thread(create_app(served.engine)) as url:
        import httpx

        body = {"model": served.engine.name, "state": state}
        body["questions"] = {k: v.model_dump(mode="json", exclude_none=True) for k, v in QUESTIONS.items()}
        wire = httpx.post(f"{url}/v1/systemone", json=body, timeout=60).json()["answers"]
    assert wire == {k: v.model_dump(mode="json", exclude_none=True) for k, v in in_process.items()}
    batch = subprocess.run(
        [sys.executable, "-m", "prefill.cli", "batch", str(data), "--questions", f"@{q}", "--state-field", "text",
         "--model", str(model), "--readout", str(out), "--out", str(tmp_path / "answers.jsonl")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert batch.returncode == 0, batch.stderr
    assert len((tmp_path / "answers.jsonl").read_text().splitlines()) == 40


def test_a_batch_the_student_answers_alone_loads_no_model_and_no_torch(student, tmp_path):
    """`prefill batch --readout STUDENT --student-below 0` over questions it was taught: the student answers every
    row by itself, with no model loaded (the named model does not even exist) and torch never imported; with a
    hand-off threshold, or a question it was not taught, the model behind it is needed."""
    from prefill.commands.batch import static_alone
    from prefill.settings import Settings

    alone = Settings(model="no-such-model", readouts=((None, str(student)),), student_below=0)
    assert isinstance(static_alone(alone, QUESTIONS), StaticEngine)
    assert static_alone(alone.replace(student_below=None), QUESTIONS) is None
    assert static_alone(alone, {**QUESTIONS, "new": Noul("Is it spam?")}) is None
    data, q, out = tmp_path / "rows.jsonl", tmp_path / "q.json", tmp_path / "answers.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(12)))
    q.write_text(json.dumps({k: v.model_dump(mode="json", exclude_none=True) for k, v in QUESTIONS.items()}))
    args = ["batch", str(data), "--questions", f"@{q}", "--state-field", "text", "--model", "no-such-model"]
    args += ["--readout", str(student), "--student-below", "0", "--out", str(out)]
    code = f"import sys; from prefill.cli import main; rc = main({args!r}); print('torch' in sys.modules); sys.exit(rc)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "False"
    engine = StaticEngine(StaticStudent(student))
    for line, text in zip(out.read_text().splitlines(), texts(12)):
        row = json.loads(line)
        answers = engine.decide(text, QUESTIONS).answers
        assert row["kind"] == answers["kind"].choice and row["urgent"] == answers["urgent"].noul
        kind = [row[f"kind.p.{k}"] for k in ("billing", "bug", "praise")]
        assert kind == list(answers["kind"].probabilities.values())
