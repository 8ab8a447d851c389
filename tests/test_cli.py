"""`prefill ask` with a local model directory (`--model DIR`), and its input errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefill.loading import resolve

from .conftest import make_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    d = tmp_path_factory.mktemp("tiny-model")
    make_model("llama", len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def ask(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefill.cli", "ask", *args], capture_output=True, text=True, timeout=300)


def test_ask_from_files(model_dir, tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"subject": "Charged twice", "body": "Refund me."}))
    (tmp_path / "q.json").write_text(json.dumps({
        "refund": {"type": "noul", "instructions": "Refund?"},
        "anger": {"type": "score", "criteria": ["calm", "angry"]}}))
    run = ask("--model", str(model_dir), "--state", f"@{tmp_path / 'state.json'}", "--questions", f"@{tmp_path / 'q.json'}", "--usage")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["model"] == resolve(str(model_dir)).name
    assert set(out["answers"]) == {"refund", "anger"} and out["usage"]["input_tokens"] > 0


def test_ask_rejects_bad_questions(model_dir):
    run = ask("--model", str(model_dir), "--state", "x", "--questions", '{"q": {"type": "choice", "criteria": {"one": null}}}')
    assert run.returncode == 2 and "criteria" in run.stderr


def test_missing_model_path_is_a_clear_error(tmp_path):
    run = ask("--model", str(tmp_path / "nope.gguf"), "--state", "x", "--questions", '{"q": {"type": "noul"}}')
    assert run.returncode == 2 and "no model file" in run.stderr and "Traceback" not in run.stderr
