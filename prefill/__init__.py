"""prefill: typed decisions from a language model in one prefill pass, with no decoding."""

from .api import Prefill
from .schema import Choice, ChoiceAnswer, Noul, NoulAnswer, Score, ScoreAnswer

__all__ = ["Prefill", "Noul", "Choice", "Score", "NoulAnswer", "ChoiceAnswer", "ScoreAnswer"]
__version__ = "0.1.0"
