"""The real-text suite's commands as the README gives them, end to end on a tiny random model (a model
directory built here): a run scores and reports, and two runs compare. A report that no longer runs (a name
renamed in prefill) fails here rather than at the end of an hour's run."""

from __future__ import annotations

import subprocess
import sys

from .conftest import make_model


def realtext(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "benchmarks.realtext", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_a_realtext_run_reports_and_compares(tmp_path, tokenizer):
    model = tmp_path / "model"
    make_model("qwen2", len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    common = ["--model", str(model), "--items", "4", "--tasks", "fr_reviews,spam", "--formats", "chat"]
    for dtype in ("float32", "bfloat16"):
        run = realtext(*common, "--synthetic", "0", "--dtype", dtype, "--out", str(tmp_path / dtype))
        assert run.returncode == 0, run.stderr[-3000:]
        assert "## model: 4 texts a task" in run.stdout and "| noul |" in run.stdout
    compared = realtext("--compare", str(tmp_path / "float32"), str(tmp_path / "bfloat16"))
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert "| mean | all |" in compared.stdout
