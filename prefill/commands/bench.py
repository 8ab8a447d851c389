"""prefill bench: speed, as ratios measured in one run (prefill/bench/)."""

from __future__ import annotations

import argparse
import json

from ..settings import Settings

HELP = "measure speed against generation and per-question passes (see prefill/bench/)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..bench import add_arguments as bench_arguments

    bench_arguments(p)


def run(settings: Settings, args) -> int:
    from ..bench import run as run_bench

    print(json.dumps(run_bench(settings, args), indent=2))
    return 0
