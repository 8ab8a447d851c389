"""The speed harness works end to end (a smoke run on a tiny model; benchmarks are not timed tests)."""
from __future__ import annotations

from benchmarks import speed

from .test_cli import model_dir  # noqa: F401 — the tiny model saved as a directory


def test_speed_harness_smoke(model_dir):  # noqa: F811
    report = speed.main(["--model", str(model_dir), "--quick"])
    s = report["semif"]
    assert s["questions"] == 3 and s["prefill_tokens"] > 0 and s["per_question_tokens"] > s["prefill_tokens"]
    assert s["generate_new_tokens"] > 0 and s["prefill_s"] > 0
    assert report["overhead"]["tokens"] == s["prefill_tokens"] and report["overhead"]["ratio"] > 0
    assert [r["questions"] for r in report["scaling"]] == [1, 3]
