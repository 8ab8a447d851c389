"""One factory: the backend the settings describe (route, backend, model, precision, prompt)."""

from __future__ import annotations

from .. import loading
from ..settings import Settings
from .base import Backend


def build_backend(settings: Settings, dtype: str) -> Backend:
    """The decoder route on torch (the reference) or vLLM, or the encoder route; `dtype` already resolved
    (backends/cpu.py `resolve_dtype`), since the default model depends on it. Set here, for every backend: its
    `precision`, what it runs in (`plan`), and who the model is (`release_date`, `fingerprint`), read from the
    model's source."""
    source, encoder, dtype = plan(settings, dtype)
    if settings.exact and (encoder or settings.backend == "vllm"):
        raise ValueError("--exact is the decoder route's CPU path on the torch backend")
    backend = _construct(settings, source, encoder, dtype)
    backend.precision = dtype
    backend.release_date, backend.fingerprint = source.release_date, loading.fingerprint(source)
    return backend


def plan(settings: Settings, dtype: str) -> tuple[loading.ModelSource, bool, str]:
    """What will run, decided before loading (so `prefill serve` can say it at start-up): the model's source,
    whether it takes the encoder route, and its precision, which is not `dtype` where auto's int8 does not
    apply (the encoder route, vLLM: int8 was measured on decoders only, so auto falls back to fp32 there)."""
    from .cpu import asked_dtype

    source = loading.resolve(settings.model, dtype)
    encoder = settings.route == "encoder" or settings.route == "auto" and loading.is_encoder(source)
    if dtype == "int8" and (encoder or settings.backend == "vllm"):
        if asked_dtype(settings.dtype) != "auto":
            raise ValueError("--dtype int8 is the decoder route's CPU path on the torch backend")
        dtype = "float32"
        source = loading.resolve(settings.model, dtype)
    return source, encoder, dtype


def _construct(settings: Settings, source: loading.ModelSource, encoder: bool, dtype: str) -> Backend:
    import torch

    prompt = dict(
        chat=settings.chat,
        system=settings.system,
        noul_words=settings.noul_words,
        score_words=settings.score_words,
        choice_words=settings.choice_words,
    )
    if encoder:
        if settings.backend != "torch":
            raise ValueError("the encoder route runs on the torch backend only")
        from transformers import AutoModel, AutoTokenizer

        from .encoder import EncoderBackend

        directory = loading.model_directory(source)
        return EncoderBackend(
            AutoModel.from_pretrained(directory, dtype=getattr(torch, dtype)),
            AutoTokenizer.from_pretrained(directory),
            source.name,
        )
    if settings.backend == "vllm":
        from transformers import AutoTokenizer

        from .vllm_lm import NO_READOUTS, VLLMBackend

        if settings.readouts:
            from .base import ReadoutUnsupported

            raise ReadoutUnsupported(NO_READOUTS)
        directory = loading.model_directory(source)
        return VLLMBackend(directory, AutoTokenizer.from_pretrained(directory), source.name, dtype=dtype, **prompt)
    from .causal_lm import CausalLMBackend

    hf_model, tokenizer = loading.load(source, dtype)
    exact = settings.exact and dtype not in ("float32", "int8")  # int8 is exact always, fp32 the reference
    if exact:
        from .cpu import make_exact

        make_exact(hf_model, dtype)
    backend = CausalLMBackend(hf_model, tokenizer, source.name, packing=settings.packing, **prompt)
    backend.exact = exact
    return backend
