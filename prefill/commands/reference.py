"""docs/cli.md, written from the parser itself (`make docs`), so the reference cannot drift from the flags:
tests/test_docs.py fails when the file is stale.

    python -m prefill.commands.reference > docs/cli.md
"""

from __future__ import annotations

import argparse

from ..settings import Settings
from . import COMMANDS, DESCRIPTION, NO_MODEL_OPTIONS, command

WIDTH = 110  # argparse wraps help to the terminal's width; the reference is the same on every machine


def usage(prog: str, add: callable, description: str | None = None) -> str:
    """The help argparse prints for `prog` with the flags `add` declares, at a fixed width."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    )
    add(p)
    return p.format_help().rstrip()


def reference() -> str:
    out = [
        "# Command-line reference",
        "",
        "<!-- Written by `make docs` (python -m prefill.commands.reference) from the parser; do not edit by hand. -->",
        "",
        f"`prefill COMMAND ...`: {DESCRIPTION} Every command that loads a model takes the",
        "[model options](#model-options), declared once (`prefill/settings.py`); each command's own flags follow.",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| [`prefill {name}`](#prefill-{name}) | {command(name).HELP} |" for name in COMMANDS),
        "",
    ]
    for name in COMMANDS:
        module = command(name)
        more = "" if name in NO_MODEL_OPTIONS else " It takes the [model options](#model-options) too."
        out += [f"## prefill {name}", "", f"{module.HELP}.{more}", "", "```text"]
        out += [usage(f"prefill {name}", module.add_arguments), "```", ""]
    out += ["## Model options", "", "Every command but `fetch` takes these (`Settings`, prefill/settings.py):", ""]
    out += ["```text", usage("prefill COMMAND", Settings.add_arguments), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")
