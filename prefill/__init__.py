"""prefill: typed decisions from a language model in one prefill pass, with no decoding.

The public API is these eight names. They load on first use (PEP 562), so `prefill --help` and the other
parts of the package that need no model never import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
_WHERE = {
    "Prefill": ".api",
    "Noul": ".schema",
    "Choice": ".schema",
    "Score": ".schema",
    "NoulAnswer": ".schema",
    "ChoiceAnswer": ".schema",
    "ScoreAnswer": ".schema",
    "with_opposite": ".scoring",
}
__all__ = list(_WHERE)

if TYPE_CHECKING:
    from .api import Prefill as Prefill
    from .schema import Choice as Choice
    from .schema import ChoiceAnswer as ChoiceAnswer
    from .schema import Noul as Noul
    from .schema import NoulAnswer as NoulAnswer
    from .schema import Score as Score
    from .schema import ScoreAnswer as ScoreAnswer
    from .scoring import with_opposite as with_opposite


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'prefill' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
