"""The speed harness works end to end (a smoke run on a tiny model; benchmarks are not timed tests)."""
from __future__ import annotations

import json
import subprocess
import sys

from .test_cli import model_dir  # noqa: F401 — the tiny model saved as a directory


def test_bench_quick_smoke(model_dir, tmp_path):  # noqa: F811
    run = subprocess.run([sys.executable, "-m", "prefill.cli", "bench", "--model", str(model_dir), "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    s = report["semif"]
    assert s["questions"] == 3 and s["prefill_tokens"] > s["state_tokens"] > 0
    assert s["pass_per_question_tokens"] > s["prefill_tokens"] and s["generate_new_tokens"] > 0
    assert s["http_request_per_question_s"] > 0
    assert s["state_tokens"] < s["prefill_tokens_run"] < s["prefill_tokens"]  # the questions' openings merged
    assert report["overhead"]["tokens"] == s["prefill_tokens_run"]
    assert [r["questions"] for r in report["scale_questions"]] == [1, 3]
    assert {r["names"] for r in report["scale_options"]} == {"short", "multi-token"}
    assert report["http"]["completed"] == 4 and report["http"]["failed"] == 0
    assert (tmp_path / "latency_vs_questions.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_runs_only_the_sections_asked_for(model_dir, tmp_path):  # noqa: F811
    run = subprocess.run([sys.executable, "-m", "prefill.cli", "bench", "--model", str(model_dir), "--quick",
                          "--sections", "overhead", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert "overhead" in report and "semif" not in report and "http" not in report
    bad = subprocess.run([sys.executable, "-m", "prefill.cli", "bench", "--model", str(model_dir), "--quick",
                          "--sections", "nope", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "unknown sections" in bad.stderr
