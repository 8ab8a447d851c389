"""prefill: typed decisions from a language model in one prefill pass, with no decoding."""

from .api import Prefill
from .schema import Choice, ChoiceAnswer, Noul, NoulAnswer, Score, ScoreAnswer
from .scoring import with_opposite

__all__ = ["Prefill", "Noul", "Choice", "Score", "NoulAnswer", "ChoiceAnswer", "ScoreAnswer", "with_opposite"]
__version__ = "0.1.0"
