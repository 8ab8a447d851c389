"""`prefill ask` with a local model directory (`--model DIR`), and its input errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefill.loading import resolve


def ask(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefill.cli", "ask", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_ask_from_files(model_dir, tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"subject": "Charged twice", "body": "Refund me."}))
    (tmp_path / "q.json").write_text(
        json.dumps(
            {
                "refund": {"type": "noul", "instructions": "Refund?"},
                "anger": {"type": "score", "criteria": ["calm", "angry"]},
            }
        )
    )
    run = ask(
        "--model",
        str(model_dir),
        "--state",
        f"@{tmp_path / 'state.json'}",
        "--questions",
        f"@{tmp_path / 'q.json'}",
        "--usage",
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["model"] == resolve(str(model_dir)).name
    assert set(out["answers"]) == {"refund", "anger"} and out["usage"]["input_tokens"] > 0


def test_ask_rejects_bad_questions(model_dir):
    run = ask(
        "--model", str(model_dir), "--state", "x", "--questions", '{"q": {"type": "choice", "criteria": {"one": null}}}'
    )
    assert run.returncode == 2 and "criteria" in run.stderr


@pytest.mark.slow
def test_a_bad_scoring_option_is_a_clear_error(model_dir):
    for bad in ("choice=magic", "colour=whole", "whole"):
        run = ask("--model", str(model_dir), "--scoring", bad, "--state", "x", "--questions", '{"q": {"type": "noul"}}')
        assert run.returncode == 2 and "--scoring" in run.stderr and "Traceback" not in run.stderr
    ok = ask(
        "--model",
        str(model_dir),
        "--scoring",
        "all=first+contextual",
        "--state",
        "x",
        "--questions",
        '{"q": {"type": "noul"}}',
    )
    assert ok.returncode == 0, ok.stderr


def test_missing_model_path_is_a_clear_error(tmp_path):
    run = ask("--model", str(tmp_path / "nope.gguf"), "--state", "x", "--questions", '{"q": {"type": "noul"}}')
    assert run.returncode == 2 and "no model file" in run.stderr and "Traceback" not in run.stderr


def prefill(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefill.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_a_mistyped_model_name_is_said_at_once_not_asked_of_the_hub():
    """Offline, a hub id is retried for about a minute before it fails; a name one typo from an embedded one
    is not a hub id a user meant. Namespaced hub ids are left to the hub."""
    run = ask("--model", "qwen2.5-coder-1.5b", "--state", "x", "--questions", '{"q": {"type": "noul"}}')
    assert run.returncode == 2 and "did you mean qwen2.5-coder-1.5b-instruct?" in run.stderr
    assert resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct").kind == "hub"


@pytest.mark.slow
def test_bad_labelled_data_and_a_missing_calibration_file_are_usage_errors(model_dir, tmp_path):
    """Each said with its file and line (or the file), exit 2, no traceback, before any model loads."""
    good = {"state": "x", "questions": {"q": {"type": "noul"}}, "gold": {"q": True}}
    cases = {
        "rows.jsonl": (json.dumps({"text": "a row to answer, not labelled"}), "rows.jsonl:1: no 'questions' field"),
        "yes.jsonl": (json.dumps({**good, "gold": {"q": "yes"}}), "yes.jsonl:1: noul gold must be true or false"),
        "text.jsonl": (json.dumps(good) + "\nnot json", "text.jsonl:2: Expecting value"),
    }
    for name, (text, _) in cases.items():
        (tmp_path / name).write_text(text + "\n")
    runs = [
        (prefill("eval", str(tmp_path / "rows.jsonl"), "--model", str(model_dir)), cases["rows.jsonl"][1]),
        (prefill("calibrate", str(tmp_path / "yes.jsonl"), "--model", str(model_dir)), cases["yes.jsonl"][1]),
        (
            prefill("train", str(tmp_path / "text.jsonl"), "--model", str(model_dir), "--out", str(tmp_path / "h")),
            cases["text.jsonl"][1],
        ),
        (
            prefill("record", str(tmp_path / "nope.jsonl"), "--model", str(model_dir), "--out", str(tmp_path / "r")),
            "nope.jsonl: No such file or directory",
        ),
    ]
    for flags in (["ask", "--state", "x", "--questions", '{"q": {"type": "noul"}}'], ["serve", "--port", "9"]):
        # serve used to start, then fail in the background (a 503 on /health), not at start-up
        run = prefill(*flags, "--model", str(model_dir), "--calibration", str(tmp_path / "cal.json"), timeout=120)
        runs.append((run, "cal.json: no such file"))
    for run, says in runs:
        assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr


@pytest.mark.slow
def test_record_train_and_serve_a_readout(model_dir, tmp_path):
    """The teacher loop end to end: record a teacher's answers, train a head on them, evaluate with it."""
    rows = []
    for i in range(10):
        angry = i % 2 == 0
        rows.append(
            {
                "family": "a" if i < 8 else "b",
                "state": ("I am furious! " if angry else "All good, thanks. ") + f"Order {i}.",
                "questions": {"q": {"type": "noul", "instructions": "Is the customer angry?"}},
                "gold": {"q": angry},
            }
        )
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    model = ("--model", str(model_dir))
    run = prefill("record", str(data), *model, "--out", str(tmp_path / "teacher.jsonl"))
    assert run.returncode == 0, run.stderr
    recorded = [json.loads(line) for line in (tmp_path / "teacher.jsonl").read_text().splitlines()]
    assert len(recorded) == 10 and recorded[0]["response"]["answers"]["q"]["type"] == "noul"
    run = prefill(
        "train",
        str(data),
        *model,
        "--teacher",
        str(tmp_path / "teacher.jsonl"),
        "--early-layer",
        "1",
        "--exclude-families",
        "b",
        "--out",
        str(tmp_path / "head"),
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["items"] == 8 and report["with_teacher"] == 8 and report["layers"] == [1, 2]
    assert "--model embeddinggemma-300m" in run.stderr  # the encoder route's measured case, pointed out
    assert (tmp_path / "head" / "final.safetensors").is_file() and (tmp_path / "head" / "early.json").is_file()
    run = prefill("eval", str(data), *model, "--readout", str(tmp_path / "head"), "--out", str(tmp_path / "ev"))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["model"].endswith("+head")
    run = prefill(
        "train",
        str(data),
        *model,
        "--teacher",
        str(tmp_path / "teacher.jsonl"),
        "--kind",
        "lora",
        "--lora-layers",
        "1",
        "--early-layer",
        "1",
        "--epochs",
        "2",
        "--out",
        str(tmp_path / "lora"),
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["validation"] == "b" and report["final"]["kind"] == "lora" and "exit_threshold" in report["early"]
    assert (tmp_path / "lora" / "lora" / "adapter_model.safetensors").is_file()
    run = prefill("eval", str(data), *model, "--readout", str(tmp_path / "lora"), "--out", str(tmp_path / "ev2"))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["model"].endswith("+lora")
    run = prefill("train", str(data), *model, "--kind", "lora", "--lora-layers", "2", "--out", str(tmp_path / "x"))
    assert run.returncode == 2 and "--lora-layers" in run.stderr
    run = prefill("train", str(data), *model, "--packing", "rows", "--out", str(tmp_path / "y"))
    assert run.returncode == 2 and "packed mode" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_label_weight_zero_trains_on_the_teacher_alone(model_dir, tmp_path):
    """`prefill train --teacher T --label-weight 0` (what distillation does): the gold labels take no part in
    the target, so the same rows with every gold label flipped train the same head, to the byte; with the
    default weight (0.5) the flipped labels train another one."""
    rows = [
        {
            "state": ("I am furious! " if i % 2 == 0 else "All good, thanks. ") + f"Order {i}.",
            "questions": {"q": {"type": "noul", "instructions": "Is the customer angry?"}},
            "gold": {"q": i % 2 == 0},
        }
        for i in range(12)
    ]
    data, flipped = tmp_path / "data.jsonl", tmp_path / "flipped.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    flipped.write_text("\n".join(json.dumps({**r, "gold": {"q": not r["gold"]["q"]}}) for r in rows))
    model = ("--model", str(model_dir))
    teacher = tmp_path / "teacher.jsonl"
    assert prefill("record", str(data), *model, "--out", str(teacher)).returncode == 0

    def head(rows_file: Path, name: str, *weight: str) -> bytes:
        out = tmp_path / name
        teaching = ("--teacher", str(teacher), "--early-layer", "0", *weight)
        run = prefill("train", str(rows_file), *model, *teaching, "--out", str(out))
        assert run.returncode == 0, run.stderr
        return (out / "final.safetensors").read_bytes()

    assert head(data, "a", "--label-weight", "0") == head(flipped, "b", "--label-weight", "0")
    assert head(data, "c") != head(flipped, "d")
