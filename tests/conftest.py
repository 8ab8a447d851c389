"""The tests' fixtures; what they share besides is in helpers.py. Tiny models are built in-process; nothing is
downloaded. Every test is in one tier, by its markers (pyproject.toml; docs/testing.md): `make test-fast` runs
those marked neither `slow` nor `default_model` nor `vllm`, `make test` runs them all."""

from __future__ import annotations

import os

# The suite's exactness checks (1e-4 and tighter) are written for the fp32 reference path: every Prefill
# and every `prefill` command the tests start (subprocesses inherit this) default to it. bf16, the served
# default on a CPU with bf16 units, is tested on its own (tests/test_precision.py) and by the default
# model's tests, which ask for it.
os.environ["PREFILL_DTYPE"] = "float32"

import pytest  # noqa: E402

from prefill.engine import Engine  # noqa: E402
from prefill.loading import default_gguf  # noqa: E402

from .helpers import make_backend, make_model, make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model(request, tokenizer):
    return make_model(request.param, len(tokenizer))


@pytest.fixture
def tiny_engine(tiny_model, tokenizer) -> Engine:
    return Engine(make_backend(tiny_model, tokenizer))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny Llama saved as a model directory, as `--model DIR` reads one."""
    d = tmp_path_factory.mktemp("tiny-model")
    make_model("llama", len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def default_prefill():
    """The embedded default model, raw probabilities (no calibration). `make test` installs it; a missing
    model fails rather than skips."""
    default_gguf()  # raises ModelNotFound with the install command
    from prefill import Prefill

    return Prefill(calibration=None)


@pytest.fixture(scope="session")
def served_default():
    """The default model as `make serve` serves it (Qwen2.5-Coder-1.5B, loading.default_name: in bf16 on a
    CPU with bf16 units, in int8 on an AVX2 CPU without them), with the default prompt, scoring and
    calibration. (The 0.5B, the default in fp32, fails these cases:
    docs/measurements/cpu-precision.md#without-bf16-units-int8.)"""
    from prefill import Prefill
    from prefill.loading import DEFAULT_BF16_NAME

    return Prefill(DEFAULT_BF16_NAME, dtype="auto")
