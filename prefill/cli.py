"""The `prefill` command's entry point (pyproject's `prefill` script and `python -m prefill.cli`); the
subcommands live in prefill/commands/, one module each."""

from __future__ import annotations

import sys

from .commands import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
