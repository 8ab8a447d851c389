"""The one scoring interface every backend implements.

The engine hands a backend a state and a list of questions as token branches, and gets back, for every
question, one log-likelihood per declared answer. How the backend computes it (a packed tree in one
pass, rows over a cached state, a trained head) is its own business; what it must guarantee is that a
question's scores depend on the state and that question alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..render import Branches, Renderer


class Backend:
    """What every backend is and does, and which optional abilities it has. Callers read the ability flags
    (`backend.reads_features`, ...) instead of probing for methods; an ability a backend lacks raises
    NotImplementedError if called anyway.

    Required: the attributes below and `score`. Optional, each with its flag:
    - `score_many(jobs)`: `score` for several (state, questions) at once in shared passes (`batches`; the
      default runs one `score` per job);
    - `features(state, questions, layers)`: hidden states from the same pass, for trained heads
      (`reads_features`; the decoder and encoder routes);
    - `features_early_exit(state, questions, early, final, exits)`: a head read at an early layer, the rest of
      the pass run only for the questions it is unsure of (`exits_early`; the decoder route);
    - `merge_adapter(path)`: a LoRA trained by `prefill train --kind lora`, merged into the weights
      (`merges_adapters`);
    - `truncated(n_state, question)`: whether a question is read with its state cut (`truncates`; the
      encoder route, whose positions are few);
    - `generate`-capable `model` (`generates`: `prefill eval --generate`'s baseline);
    - `forget_states()`: drop the states kept for later requests (benchmarks time cold requests);
    - `close()`: release what the backend started (vLLM's engine core); the default does nothing.
    `route` is "decoder" or "encoder" (the encoder route has no answer log-likelihoods of its own: untrained,
    its answers are near chance, which the commands say)."""

    name: str  # the served model name
    answers_by = "one prefill pass"  # how it answers, for its description
    # Who the model is, set by the factory from the model's source (a backend built by hand has neither):
    release_date = ""  # YYYY-MM-DD, for GET /v1/models
    fingerprint = ""  # identifies the weights: calibrations are tied to it, readouts to `readout_fingerprint`
    # what a trained head reads, where the weights alone do not say it (a readout trained on other features of
    # the same weights is refused); "" on the decoder route
    readout_features = ""
    renderer: Renderer
    max_context: int  # longest state + question + answer the model can position
    precision = "float32"  # what the weights run in: "float32", "bfloat16" or "int8" (set by the factory)
    exact = False  # bf16 made bit-exact however a question is packed or batched (--exact, cpu.make_exact)
    plain = False  # bf16 left plain (--exact off): answers move by up to a few hundredths with their neighbours
    route = "decoder"
    weight_bytes = 0  # the model's weights, one copy each, as served (0: not known; weights.served_bytes)
    batches = False
    reads_features = False
    exits_early = False
    merges_adapters = False
    truncates = False
    generates = False

    @property
    def readout_fingerprint(self) -> str:
        """What trained readouts are tied to: the weights, and the features the heads read from them."""
        return f"{self.fingerprint}+{self.readout_features}" if self.readout_features else self.fingerprint

    @property
    def description(self) -> str:
        """What /v1/models and `prefill serve` say it is: the model, how it answers, in what precision."""
        mode = ", exact" if self.exact else ", plain" if self.plain else ""
        return f"{self.name} ({self.answers_by}, {self.precision}{mode})"

    def score(self, state: Sequence[int], questions: Sequence[Branches]) -> list[list[float]]:
        """Log-likelihood of each answer's whole token sequence given the state and its question."""
        raise NotImplementedError

    def score_many(self, jobs: Sequence[tuple[Sequence[int], Sequence[Branches]]]) -> list[list[list[float]]]:
        return [self.score(state, questions) for state, questions in jobs]

    def features(self, state: Sequence[int], questions: Sequence[Branches], layers: Sequence[int]) -> list:
        raise NotImplementedError(f"{self.name} gives no hidden states")

    def features_early_exit(self, state, questions, early: int, final: int, exits) -> tuple:
        raise NotImplementedError(f"{self.name} has no early exit")

    def merge_adapter(self, path) -> None:
        raise NotImplementedError(f"{self.name} cannot merge a LoRA")

    def truncated(self, n_state: int, question: Branches) -> bool:
        return False

    def forget_states(self) -> None:
        pass

    def close(self) -> None:
        pass


class ReadoutUnsupported(ValueError):
    """A request a trained readout cannot score exactly with this backend's settings (a 400, not a 500)."""


class RequestTooLarge(ValueError):
    """The request needs more tokens or positions than a configured or model limit allows (a 413)."""
