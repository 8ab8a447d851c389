"""The real-text suite's commands as the README gives them, end to end on a tiny random model (a model
directory built here): a run scores and reports, and two runs compare. A report that no longer runs (a name
renamed in prefill) fails here rather than at the end of an hour's run."""

from __future__ import annotations

import json
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


def test_an_opposites_run_asks_each_opposite_as_served(tmp_path, tokenizer):
    """benchmarks.opposites as the README runs it: every reading from one request a text, the paired answer
    (`x_opposite`, served) the question and its opposite read together, and the table from the saved run."""
    from prefill import with_opposite

    model = tmp_path / "model"
    make_model("qwen2", len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    cmd = [sys.executable, "-m", "benchmarks.opposites", "--model", str(model), "--dtype", "float32"]
    run = subprocess.run(
        [*cmd, "--items", "4", "--tasks", "fr_reviews,spam", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert list(results) == ["fr_reviews", "spam"] and len(results["spam"]["opposites"]) == 3
    for row in results["spam"]["rows"]:
        for i in range(3):
            want = with_opposite(row["p"]["alone"], row["p"][f"opposite {i}"])
            assert abs(row["p"][f"paired {i}"] - want) < 1e-6
    again = subprocess.run([*cmd, "--report", str(tmp_path / "o")], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout == run.stdout
    assert '"Is this a legitimate email?"' in run.stdout and "| fr_reviews |" in run.stdout
    bad = subprocess.run([*cmd, "--tasks", "sarcasm"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "sarcasm not one of" in bad.stderr


def test_a_distillation_run_then_the_student_and_teacher_timed_in_turn(tmp_path, tokenizer):
    """benchmarks.distill_tasks as the README runs it (a tiny teacher loaded here, a tiny student with a head),
    then `--time-teacher N --model STUDENT`: both timed on the same rows in one process, with the ratio."""
    model = tmp_path / "model"
    make_model("qwen2", len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    common = ["--teacher-model", str(model), "--tasks", "fr_reviews", "--out", str(tmp_path / "run")]
    cmd = [sys.executable, "-m", "benchmarks.distill_tasks", *common]
    run = subprocess.run([*cmd, "--rows", "10", "--model", str(model)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "fr_reviews" / "final.json").exists()
    timed = subprocess.run(
        [*cmd, "--time-teacher", "3", "--model", str(model)], capture_output=True, text=True, timeout=600
    )
    assert timed.returncode == 0, timed.stderr[-3000:]
    for line in ("fr_reviews: the teacher alone", "fr_reviews: the student alone", "x the teacher's speed"):
        assert line in timed.stdout, timed.stdout
    assert timed.stderr.count("fr_reviews: row ") == 3 and "student " in timed.stderr


def fastpath_on_a_tiny_model(tmp_path, tokenizer, flag: str) -> list[str]:
    """`python -m benchmarks.fastpath FLAG MODEL` on a tiny Qwen2 model: the lines it prints."""
    model = tmp_path / "model"
    make_model("qwen2", len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    cmd = [sys.executable, "-m", "benchmarks.fastpath", flag, str(model)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_a_profile_of_the_semif_request_by_operator(tmp_path, tokenizer):
    """benchmarks.fastpath --profile as the README runs it: the request's operators, largest first, their
    shares summing to at most 100 %, and the products' rate against a bare linear layer timed then."""
    lines = fastpath_on_a_tiny_model(tmp_path, tokenizer, "--profile")
    assert "the SemIf request (21 questions," in lines[0]
    ops = [line for line in lines[1:] if line.startswith("  ")]
    seconds = [float(line.split()[-5]) for line in ops]
    assert len(ops) >= 5 and seconds == sorted(seconds, reverse=True)
    assert sum(float(line.split()[-3]) for line in ops) <= 100.5
    assert lines[-1].startswith("matrix products: ") and "a bare linear layer in bf16 now: " in lines[-1]


def test_the_element_wise_work_fused_by_torch_compile_answers_as_eager(tmp_path, tokenizer):
    """benchmarks.fastpath --fused as the README runs it (fp32 here, the suite's precision): the compile's cost,
    both paths' seconds, and the fused kernels' answers equal to the eager ones and still isolated."""
    lines = fastpath_on_a_tiny_model(tmp_path, tokenizer, "--fused")
    assert "compiling the fused kernels" in lines[0]
    assert lines[1].startswith("eager (served): SemIf 21 questions ") and lines[2].startswith("fused: SemIf 21 ")
    moved, isolated = (float(part.split()[-1]) for part in lines[3].split(";"))
    assert moved < 1e-5 and isolated < 1e-5  # other kernels, the same arithmetic: fp32 rounding only
