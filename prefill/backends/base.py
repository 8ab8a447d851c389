"""The one scoring interface every backend implements.

The engine hands a backend a state and a list of questions as token branches, and gets back, for every
question, one log-likelihood per declared answer. How the backend computes it (a packed tree in one
pass, rows over a cached state, a trained head) is its own business; what it must guarantee is that a
question's scores depend on the state and that question alone.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..render import Branches, Renderer


class Backend(Protocol):
    name: str                 # the served model name
    description: str
    release_date: str         # YYYY-MM-DD, for GET /v1/models
    fingerprint: str          # identifies the weights: calibrations and readouts are tied to it
    renderer: Renderer
    max_context: int          # longest state + question + answer the model can position

    def score(self, state: Sequence[int], questions: Sequence[Branches]) -> list[list[float]]:
        """Log-likelihood of each answer's whole token sequence given the state and its question."""
        ...

    # Optional: score_many(jobs), `score` for several (state, questions) at once in shared passes; the
    # module function score_many below falls back to one `score` per job.
    # Backends that serve trained readouts also have features(state, questions, layers) (hidden states
    # from the same packed pass) and features_early_exit(state, questions, early, final, exits); for a
    # readout trained with a LoRA, merge_adapter(path), which the Engine calls.


def score_many(backend: Backend, jobs: Sequence[tuple[Sequence[int], Sequence[Branches]]]) -> list[list[list[float]]]:
    """`backend.score` for each (state, questions) job, in shared passes where the backend can."""
    if hasattr(backend, "score_many"):
        return backend.score_many(jobs)
    return [backend.score(state, questions) for state, questions in jobs]


class ReadoutUnsupported(ValueError):
    """A request a trained readout cannot score exactly with this backend's settings (a 400, not a 500)."""


class RequestTooLarge(ValueError):
    """The request needs more tokens or positions than a configured or model limit allows (a 413)."""
