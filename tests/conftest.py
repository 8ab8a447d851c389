"""Tiny models built in-process: a byte-level BPE tokenizer with a ChatML template, and 2-layer Llama and
Qwen2 models with random weights large enough that answers really depend on the context (so a leak
between branches would show). Nothing is downloaded."""

from __future__ import annotations

import os

# The suite's exactness checks (1e-4 and tighter) are written for the fp32 reference path: every Prefill
# and every `prefill` command the tests start (subprocesses inherit this) default to it. bf16, the served
# default on a CPU with bf16 units, is tested on its own (tests/test_precision.py) and by the default
# model's tests, which ask for it.
os.environ["PREFILL_DTYPE"] = "float32"

import pytest  # noqa: E402
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from prefill.backends.causal_lm import CausalLMBackend
from prefill.engine import Engine
from prefill.loading import default_gguf
from prefill.scoring import Scoring

RAW = {t: Scoring("whole", "none") for t in ("noul", "choice", "score")}  # whole-sequence likelihood, uncorrected

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"  # noqa: E501
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "I was charged twice for my March invoice and the refund has not arrived.",
    "Which team should handle this ticket? Billing, Technical, Sales, Shipping.",
    "Question: Answer Yes or No. Options: Levels: fraud review, not fraud, calm, angry, very angry.",
    "The app crashes on launch since the update. Error code 500. Please fix this today.",
    "배송이 3일째 안 와요. 그냥 환불해 주세요. 🙂 Queue 001 002 003 0123456789",
] * 20


def make_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    return fast


def make_model(kind: str, vocab: int, seed: int = 0, **config):
    """`config`: overrides, e.g. num_attention_heads=2 for head_dim 32 (vLLM's CPU kernels take no 16)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    common.update(config)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    return model.float().eval()


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model(request, tokenizer):
    return make_model(request.param, len(tokenizer))


def make_backend(model, tokenizer, **kw) -> CausalLMBackend:
    backend = CausalLMBackend(model, tokenizer, "tiny", **kw)
    backend.release_date = "2026-11-29"
    return backend


@pytest.fixture
def tiny_engine(tiny_model, tokenizer) -> Engine:
    return Engine(make_backend(tiny_model, tokenizer))


@pytest.fixture(scope="session")
def default_prefill():
    """The embedded default model, raw probabilities (no calibration). `make test` installs it; a missing
    model fails rather than skips."""
    default_gguf()  # raises ModelNotFound with the install command
    from prefill import Prefill

    return Prefill(calibration=None)
