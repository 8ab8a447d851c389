"""The one factory: from `Settings` to a running engine, each decision made once.

`plan(settings)` decides what will run before anything loads (so `prefill serve` can say it at start-up, and a
wrong model name fails at once): the model's source, its route and its precision. `backend(settings, plan)`
loads it. `engine(...)` puts the engine together over a backend: scoring, calibration, a trained head, the
fallback. `Prefill` (api.py) and every command build through these, and every refusal of a combination of
settings is written here once (`check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import loading
from .backends.base import Backend, ReadoutUnsupported
from .calibration import find_calibration, setup
from .engine import Engine
from .precision import asked_dtype, resolve_dtype, torch_dtype
from .scoring import DEFAULT as DEFAULT_SCORING
from .scoring import Scoring, ways_asked
from .settings import Settings

if TYPE_CHECKING:  # torch modules: checking settings (every command) needs no torch
    from .heads import Heads

NO_READOUTS = (
    "trained readouts read the model's hidden states, which vLLM does not return for prompt tokens; "
    "serve them with the torch backend (the default, --backend torch)"
)
NOT_THIS_ROUTE = "an early-exit head or a LoRA adapter needs the decoder route"
LORA_CANNOT_SHARE = (
    "a readout trained with a LoRA adapter changes the base model's weights, so it cannot share "
    "them with other readouts or the plain base: serve it alone, one process per LoRA readout"
)


@dataclass(frozen=True)
class Plan:
    """What will run: the model's source, whether it takes the encoder route, and its precision (what the
    weights run in: auto's choice for this machine, or what was asked)."""

    source: loading.ModelSource
    encoder: bool
    precision: str
    auto: bool  # the precision is auto's choice, not asked for

    @property
    def name(self) -> str:
        return self.source.name


def check(settings: Settings, encoder: bool | None = None) -> None:
    """The combinations of settings that cannot run, refused before anything loads (ValueError; the command
    line says it as a usage error). `encoder`: the route, once the model's config has told it."""
    encoder = settings.route == "encoder" if encoder is None else encoder
    if settings.backend == "vllm":
        if encoder:
            raise ValueError("the encoder route runs on the torch backend only")
        if settings.readouts:
            raise ReadoutUnsupported(f"--readout with --backend vllm: {NO_READOUTS}")
    if settings.exact is True and (encoder or settings.backend == "vllm"):
        raise ValueError("--exact on is the decoder route's CPU path on the torch backend (auto: where it applies)")


def plan(settings: Settings) -> Plan:
    """What will run, decided before loading. The default model depends on the precision (the 1.5B where
    the products are fast: loading.default_name), and auto's int8 does not apply where it was not measured
    (the encoder route, vLLM: auto falls back to fp32 there; int8 asked for there is refused)."""
    dtype = resolve_dtype(settings.dtype)
    auto = asked_dtype(settings.dtype) == "auto"
    source = loading.resolve(settings.model, dtype)
    encoder = settings.route == "encoder" or settings.route == "auto" and loading.is_encoder(source)
    check(settings, encoder)
    if dtype == "int8" and (encoder or settings.backend == "vllm"):
        if not auto:
            raise ValueError("--dtype int8 is the decoder route's CPU path on the torch backend")
        dtype = "float32"
        source = loading.resolve(settings.model, dtype)
    return Plan(source, encoder, dtype, auto)


def backend(settings: Settings, plan: Plan) -> Backend:
    """The backend the plan describes, with who the model is (`release_date`, `fingerprint`) and what it runs
    in (`precision`) set on it."""
    made = _construct(settings, plan)
    made.precision = plan.precision
    made.release_date, made.fingerprint = plan.source.release_date, loading.fingerprint(plan.source)
    return made


def load_causal_lm(source: loading.ModelSource, dtype: str = "float32"):
    """(model, tokenizer) of a causal LM in `dtype` (GGUF weights converted and cached on first use; int8: an
    fp32 model whose decoder's linears are then quantised, with float64 attention, backends/cpu.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = loading.model_directory(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype(dtype))
    except OSError as e:
        raise loading.ModelNotFound(f"cannot load model {source.location!r}: {e}") from e
    if dtype == "int8":
        from .backends.cpu import to_int8

        to_int8(model)
    return model, tokenizer


def _construct(settings: Settings, plan: Plan) -> Backend:
    prompt = dict(
        chat=settings.chat,
        system=settings.system,
        noul_words=settings.noul_words,
        score_words=settings.score_words,
        choice_words=settings.choice_words,
    )
    source, dtype = plan.source, plan.precision
    if plan.encoder:
        from transformers import AutoModel, AutoTokenizer

        from .backends.encoder import EncoderBackend

        directory = loading.model_directory(source)
        return EncoderBackend(
            AutoModel.from_pretrained(directory, dtype=torch_dtype(dtype)),
            AutoTokenizer.from_pretrained(directory),
            source.name,
        )
    if settings.backend == "vllm":
        from transformers import AutoTokenizer

        from .backends.vllm_lm import VLLMBackend

        directory = loading.model_directory(source)
        return VLLMBackend(directory, AutoTokenizer.from_pretrained(directory), source.name, dtype=dtype, **prompt)
    from .backends.causal_lm import CausalLMBackend

    hf_model, tokenizer = load_causal_lm(source, dtype)
    exact = exactness(settings.exact, dtype)
    if exact:
        from .backends.cpu import make_exact

        make_exact(hf_model, dtype)
    made = CausalLMBackend(hf_model, tokenizer, source.name, packing=settings.packing, **prompt)
    made.exact, made.plain = exact, dtype == "bfloat16" and not exact
    return made


def exactness(asked: bool | None, dtype: str) -> bool:
    """Whether bf16 is made exact (backends/cpu.py `make_exact`): by default wherever the CPU has bf16 units,
    asked for (`--exact on`) even where it is refused, never with `--exact off`. int8 is exact always and fp32 is
    the reference: neither has anything to add."""
    from .precision import has_bf16_units

    if asked is False or dtype in ("float32", "int8"):
        return False
    return asked is True or dtype == "bfloat16" and has_bf16_units()


def readout(backend: Backend, path: str | Path) -> Heads:
    """A trained readout for this backend: refused if fitted on other weights (Heads.load), or if the backend
    cannot give what it reads (hidden states, which vLLM does not return; for an early-exit head or a LoRA
    adapter, the decoder's layer-by-layer pass)."""
    if not backend.reads_features:
        raise ReadoutUnsupported(NO_READOUTS)
    from .heads import Heads

    heads = Heads.load(path, backend.readout_fingerprint)
    if heads.early is not None and not backend.exits_early or heads.adapter is not None and not backend.merges_adapters:
        raise ReadoutUnsupported(f"{path}: {NOT_THIS_ROUTE}")
    return heads


def check_shared(adapters: list[bool]) -> None:
    """Readouts served on one copy of the weights (`adapters`: whether each was trained with a LoRA): a LoRA
    changes the weights, so it is served alone."""
    if len(adapters) > 1 and any(adapters):
        raise ValueError(LORA_CANNOT_SHARE)


def scoring_for(backend: Backend, asked: Mapping[str, str | Scoring] | None) -> dict[str, Scoring]:
    """The training-free scoring per question type: the defaults (scoring.py), those asked over them. The
    encoder route scores its slots as they are (whole options; no prior unless a correction is asked)."""
    asked_ways = ways_asked(asked)
    if backend.route == "encoder":
        if any(w.tokens != "whole" for w in asked_ways.values()):
            raise ValueError("the encoder route scores whole options: only a correction can be chosen (whole+pmi)")
        return {**dict.fromkeys(("noul", "choice", "score"), Scoring("whole")), **asked_ways}
    return {**DEFAULT_SCORING, **asked_ways}


def engine(
    settings: Settings, backend: Backend, heads: Heads | None = None, fallback: Any = None, served_as=None
) -> Engine:
    """The engine over `backend` the settings describe: their limits, scoring, calibration (the base model's,
    found for this prompt and scoring), fact pass and fallback threshold; `heads`: a trained readout read
    instead of the log-likelihoods (it carries its own calibration)."""
    ways = scoring_for(backend, settings.scoring)
    return Engine(
        backend,
        max_request_tokens=settings.max_request_tokens,
        max_sequence_tokens=settings.max_sequence_tokens,
        scoring=ways,
        calibration=find_calibration(settings.calibration, backend.fingerprint, setup(backend.renderer, ways)),
        use_facts=settings.facts,
        heads=heads,
        fallback_below=settings.fallback_below,
        fallback=fallback,
        served_as=served_as,
    )


def static_engine(settings: Settings, path: str | Path, next_tier: Any = None, served_as: str | None = None):
    """A static student (prefill/static.py) served in front of `next_tier` (the base model's engine, with its
    own fallback): a three-tier cascade, each hand-off by a confidence threshold."""
    from .static import StaticEngine, StaticStudent

    student = StaticStudent(path)
    below = settings.student_below if settings.student_below is not None else student.hand_off_below
    return StaticEngine(student, fallback=next_tier, hand_off_below=below or None, served_as=served_as)


def fallback(settings: Settings):
    """The fallback the settings describe: a remote server (--fallback-url), a stronger local model
    (--fallback-model alone, built here with this one's precision, limits and fact pass), or none."""
    if settings.fallback_url:
        from .fallback import remote

        return remote(
            settings.fallback_url,
            settings.fallback_kind,
            model=settings.fallback_model,
            api_key=settings.fallback_key,
            timeout=settings.fallback_timeout,
        )
    if settings.fallback_model:
        stronger = Settings(
            model=settings.fallback_model,
            dtype=settings.dtype,
            max_request_tokens=settings.max_request_tokens,
            facts=settings.facts,
        )
        return engine(stronger, backend(stronger, plan(stronger)))
    return None
