"""What the tests share, in one place (tests never import each other, nor the lab in benchmarks/): tiny models
built in-process (a byte-level BPE tokenizer with a ChatML template, 2-layer Llama and Qwen2 models with random
weights large enough that answers really depend on the context, so a leak between branches would show; a 2-layer
BERT for the encoder route), the standard ticket and its questions, the invariance checks, and the wire forms.
Nothing is downloaded. Fixtures are in conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from prefill.backends.causal_lm import CausalLMBackend
from prefill.engine import Engine
from prefill.schema import Choice, Noul, Score
from prefill.scoring import Scoring

ROOT = Path(__file__).resolve().parents[1]
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


def make_backend(model, tokenizer, **kw) -> CausalLMBackend:
    backend = CausalLMBackend(model, tokenizer, "tiny", **kw)
    backend.release_date = "2026-11-29"
    return backend


def tiny_bert(tokenizer) -> BertModel:
    """A 2-layer random BERT over `tokenizer`'s vocabulary (seeded), for the encoder route's tests."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    config.update({"intermediate_size": 128, "max_position_embeddings": 512, "initializer_range": 0.3})
    return BertModel(config)


# ---------------------------------------------------------------- the standard ticket and its questions

TOL = 1e-4  # every invariance in fp32, the reference path
STATE = "I was charged twice for my March invoice and the refund has not arrived. Please fix this today."
QUESTIONS = {
    "refund": Noul("Is the customer asking for money back?"),
    "threat": Noul(criteria={"true": "The customer threatens a chargeback"}),
    "team": Choice(
        "Which team should handle this ticket?",
        {"Billing": "Payments, invoices, refunds", "Technical": ["bugs", "outages"], "Sales": None},
    ),
    "fraud": Choice("What is this?", ["fraud", "fraud review", "not fraud"]),
    "anger": Score("How angry is the customer?", ["calm", "annoyed", {"label": "very angry"}]),
}


def probs(answer) -> list[float]:
    if answer.type == "noul":
        return [answer.noul]
    return list(answer.probabilities.values())


def max_delta(a: dict, b: dict) -> float:
    return max(max(abs(x - y) for x, y in zip(probs(a[k]), probs(b[k]))) for k in a)


def assert_invariances(engine: Engine, plain: Engine) -> None:
    """`engine` answers differently from `plain`, and keeps every invariance of the packed path."""
    together, _ = engine.ask(STATE, QUESTIONS)
    assert max_delta(together, plain.ask(STATE, QUESTIONS)[0]) > 1e-3  # the readout really changes answers
    for qid, q in QUESTIONS.items():  # packed == alone
        assert max_delta(engine.ask(STATE, {qid: q})[0], {qid: together[qid]}) <= TOL
    renamed = {f"x{i}": QUESTIONS[k] for i, k in enumerate(reversed(list(QUESTIONS)))}
    shuffled, _ = engine.ask(STATE, renamed)  # order and ids
    assert max_delta({f"x{i}": together[k] for i, k in enumerate(reversed(list(QUESTIONS)))}, shuffled) <= TOL
    team = QUESTIONS["team"]
    flipped = Choice(team.instructions, dict(reversed(list(team.criteria.items()))))  # option order
    a, b = engine.ask(STATE, {"q": team})[0]["q"], engine.ask(STATE, {"q": flipped})[0]["q"]
    assert all(abs(a.probabilities[k] - b.probabilities[k]) <= TOL for k in team.criteria)


def head(kind: str, layer: int = 2, use_base: bool = True, seed: int = 0):
    """A "trained" readout head over the tiny models: its weights moved far from the untrained identity."""
    from prefill.heads import Head, HeadConfig, answer_key
    from prefill.schema import answer_labels

    torch.manual_seed(seed)
    taught = sorted({answer_key(q.type, a) for q in QUESTIONS.values() for a in answer_labels(q)})
    cfg = HeadConfig(kind=kind, layer=layer, hidden=64, use_base=use_base, model="tiny", rank=8, answers=taught)
    r = Head(cfg)
    with torch.no_grad():
        for p in r.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)
    return r.eval()


# ---------------------------------------------------------------- the wire form

NOUL = {"type": "noul", "instructions": "Is the customer asking for money back?"}
CHOICE = {
    "type": "choice",
    "instructions": "Which team?",
    "criteria": {"Billing": "Invoices", "Technical": None, "환불 🙂": ["x"]},
}
SCORE = {"type": "score", "instructions": "How angry?", "criteria": ["Calm", {"label": "Annoyed"}, ["Very", "angry"]]}


def body(questions, **extra):
    return {"model": "jev-latest", "state": "I was charged twice.", "questions": questions, **extra}


# ---------------------------------------------------------------- the vLLM venv

VLLM_PYTHON = Path(os.environ.get("PREFILL_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))


def need_vllm() -> None:
    """Skip without the vLLM venv, except under `make test` (PREFILL_REQUIRE_VLLM), where it must be there."""
    if not VLLM_PYTHON.exists():
        if os.environ.get("PREFILL_REQUIRE_VLLM"):
            pytest.fail(f"{VLLM_PYTHON} is missing: make vllm-setup")
        pytest.skip("no vLLM venv (make vllm-setup)")
