"""The `prefill` command, one module per subcommand (the way vLLM's entrypoints/cli does it): each has
HELP, `add_arguments(parser)` for its own flags, and `run(settings, args)`. The model options every command
shares are declared once, in settings.py."""

from __future__ import annotations

import argparse
import importlib

from ..settings import Settings
from .common import check_vllm, usage_error

COMMANDS = ("serve", "ask", "batch", "eval", "calibrate", "train", "record", "bench", "distill")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="prefill", description="Typed decisions from a language model in one prefill pass."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(f".{name}", __name__) for name in COMMANDS}
    for name, module in modules.items():
        p = sub.add_parser(name, help=module.HELP)
        Settings.add_arguments(p)
        module.add_arguments(p)
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_args(args)
    except ValueError as e:
        usage_error(str(e))
    if settings.backend == "vllm":
        check_vllm(settings, args.command, generate=getattr(args, "generate", False))
    return modules[args.command].run(settings, args)
