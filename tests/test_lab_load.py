"""The load test (benchmarks/speed/load.py) at small scale, on the default model, over loopback: `prefill serve`
as shipped carries load at its capacity without an error, and at 4x its capacity refuses the excess at once
with 429/503 + Retry-After in TypeSafe's error shape while what it accepts is answered in bounded time, its
memory stays bounded and it stays up. The table of docs/measurements/serving-under-load.md is the same command at full
scale."""

from __future__ import annotations

import pytest

from benchmarks.speed import load
from prefill.serving.scheduler import DEFAULT_MAX_WAIT_S

pytestmark = pytest.mark.default_model


def test_load_at_capacity_and_at_four_times_capacity():
    report = load.main(
        [
            "--seconds",
            "6",
            "--repeats",
            "1",
            "--concurrency",
            "1,4",
            "--batching",
            "on",
            "--sustain",
            "12",
            "--sustain-clients",
            "4",
            "--overload",
            "4",
            "--overload-seconds",
            "12",
        ]
    )
    for row in report["throughput"]:
        assert row["errors"] == 0 and row["answered"] > 0, row
    sustained = report["sustained"]
    assert sustained["errors"] == 0 and sustained["refused"] == 0 and sustained["answered"] > 0, sustained
    over = report["overload"]
    assert over["errors"] == 0 and not over["problems"], over  # every refusal documented
    assert over["answered"] + over["refused"] == over["sent"]  # every request accounted for
    assert over["refused"] > 0 and over["refused_p99_s"] < 1.0, over  # 429s, and fast
    assert over["p99_s"] < DEFAULT_MAX_WAIT_S + 15, over  # accepted: bounded latency
    assert over["alive_after"] and over["peak_rss_mib"] < over["rss_before_mib"] + 1024, over
