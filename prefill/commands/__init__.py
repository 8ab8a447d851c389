"""The `prefill` command, one module per subcommand (the way vLLM's entrypoints/cli does it): each has
HELP, `add_arguments(parser)` for its own flags, and `run(settings, args)`. The model options every command
shares are declared once, in settings.py. Building the parser imports no torch (`prefill --help` answers at
once); each command loads what it needs when it runs."""

from __future__ import annotations

import argparse
import importlib

from ..settings import Settings
from .common import check_vllm, usage_error

COMMANDS = ("serve", "ask", "batch", "eval", "calibrate", "train", "record", "bench", "distill", "fetch")
NO_MODEL_OPTIONS = ("fetch",)  # commands that load no model take no model options


DESCRIPTION = "Typed decisions from a language model in one prefill pass."


def parser() -> argparse.ArgumentParser:
    """The whole command line: every command with its own flags and, where it loads a model, the model options."""
    top = argparse.ArgumentParser(prog="prefill", description=DESCRIPTION)
    sub = top.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = command(name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if name not in NO_MODEL_OPTIONS:
            Settings.add_arguments(p)
        module.add_arguments(p)
    return top


def command(name: str):
    """A command's module (HELP, add_arguments, run)."""
    return importlib.import_module(f".{name}", __name__)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    module = command(args.command)
    if args.command in NO_MODEL_OPTIONS:
        return module.run(None, args)
    try:
        settings = Settings.from_args(args)
        from ..build import check

        check(settings)
    except ValueError as e:
        usage_error(str(e))
    if settings.backend == "vllm":
        check_vllm(args.command, generate=getattr(args, "generate", False))
    return module.run(settings, args)
