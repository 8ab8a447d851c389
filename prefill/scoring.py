"""Training-free scoring: how the model's token log-probabilities become one score per declared answer.
(Not the trained heads of `prefill train`, which `--readout` serves: those are heads/.)

A token rule (`tokens`) says which of an answer's tokens count:
- "whole": the answer's tokens and the end-of-answer marker (the probability that the model says exactly
  this answer and stops): exact for options of any length and for options sharing first tokens;
- "noend": the answer's tokens without the marker;
- "mean": "whole" divided by its number of tokens (length-normalised);
- "first": the answer's first token only (what most peers read; ties options that share a first token).

A correction divides out the answer prior the question itself induces, measured without labels:
- "contextual" (Zhao et al. 2021, contextual calibration): the same question asked about content-free
  states ("N/A", "" and "[MASK]"); their answer distributions, averaged, are the prior p_cf, and each
  answer's score becomes score - log p_cf. A question that leans to "No" whatever the text (small models
  do) then answers by how much this text moves it from that lean;
- "pmi" (Holtzman et al. 2021, domain-conditional PMI): the same with the empty state only, i.e. the
  answer's likelihood given the question alone.
A weight λ on the prior (`whole+pmi*0.5`: score - λ·log p_cf) keeps part of it: λ = 1 divides it out
entirely, λ = 0 is the raw likelihood. Where the prior is informative (most short messages are English, most
mail is not spam) dividing all of it out pushes answers away from the common, right one.
The prior depends on the question's tokens only, so it is computed once per distinct question (one short
extra pass) and cached; it is computed in the same isolated way as the answers, so a corrected answer still
cannot depend on the other questions, their order or ids, and permuting the options permutes the prior.

Which token rule and correction the engine uses per question type was chosen on real labelled text
(benchmarks/quality/realtext.py; docs/measurements/real-text.md): see DEFAULT.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .render import Branches
from .schema import Noul

TOKEN_RULES = ("whole", "noend", "mean", "first")
CORRECTIONS = ("none", "contextual", "pmi")
CONTENT_FREE = {"contextual": ("N/A", "", "[MASK]"), "pmi": ("",)}


@dataclass(frozen=True)
class Scoring:
    tokens: str = "whole"
    correction: str = "none"
    prior_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.tokens not in TOKEN_RULES:
            raise ValueError(f"the token rule must be one of {', '.join(TOKEN_RULES)}, not {self.tokens!r}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, not {self.correction!r}")
        if not 0.0 <= self.prior_weight <= 1.0:
            raise ValueError(f"the prior's weight must be within 0..1, not {self.prior_weight}")

    def __str__(self) -> str:
        if self.correction == "none":
            return self.tokens
        weight = "" if self.prior_weight == 1.0 else f"*{self.prior_weight:g}"
        return f"{self.tokens}+{self.correction}{weight}"

    @classmethod
    def parse(cls, text: str) -> Scoring:
        """ "whole", "first+contextual", "whole+pmi*0.5", ... (the form str() gives)."""
        tokens, _, correction = text.partition("+")
        correction, _, weight = correction.partition("*")
        try:
            return cls(tokens, correction or "none", float(weight) if weight else 1.0)
        except ValueError as e:
            raise ValueError(f"bad scoring {text!r}: {e}") from None

    def branches(self, b: Branches) -> Branches:
        """The token branches this rule scores: each answer cut to the tokens that count."""
        if self.tokens == "first":
            return Branches(b.prompt, tuple(a[:1] for a in b.answers), 0)
        if self.tokens == "noend" and b.end:
            return Branches(b.prompt, tuple(a[: len(a) - b.end] for a in b.answers), 0)
        return b

    def combine(self, b: Branches, loglik: Sequence[float]) -> list[float]:
        """Each answer's score from the log-likelihood of the tokens `branches` kept."""
        if self.tokens == "mean":
            return [x / len(a) for x, a in zip(loglik, b.answers)]
        return list(loglik)


# The engine's default per question type, chosen on real labelled text (benchmarks/quality/realtext.py; the numbers
# are in docs/measurements/real-text.md and "Real tasks"): the token rules that score "this answer, then stop" (whole,
# mean) rank answers as well as the first token does and stay exact for options sharing first tokens, and
# PMI is what turns that ranking into right answers at a 0.5 threshold; it also costs one content-free pass
# per new question where contextual costs three.
DEFAULT = {"noul": Scoring("whole", "pmi"), "choice": Scoring("whole", "pmi"), "score": Scoring("whole", "pmi")}


def ways_asked(asked: Mapping[str, str | Scoring] | None) -> dict[str, Scoring]:
    """{question type: Scoring} from what a user asked, by the command line (--scoring TYPE=WAY) or in Python
    (`Prefill(scoring={"all": "whole"})`): `all` sets every type and a type named after it wins. A type that
    is not one raises ValueError, so a misspelt key is refused rather than silently ignored."""
    ways: dict[str, Scoring] = {}
    for qtype, way in sorted((asked or {}).items(), key=lambda kv: kv[0] != "all"):
        if qtype not in (*DEFAULT, "all"):
            raise ValueError(f"scoring is set per question type: {', '.join(DEFAULT)} or all, not {qtype!r}")
        parsed = way if isinstance(way, Scoring) else Scoring.parse(way)
        ways.update(dict.fromkeys(DEFAULT if qtype == "all" else (qtype,), parsed))
    return ways


def log_normalised(scores: Sequence[float]) -> list[float]:
    """log softmax over the declared answers (-inf stays -inf); the normaliser summed exactly, whatever the
    options' order (as `engine.softmax`)."""
    finite = [x for x in scores if math.isfinite(x)]
    if not finite:
        return [-math.log(len(scores))] * len(scores)
    top = max(finite)
    z = top + math.log(math.fsum(math.exp(x - top) for x in finite))
    return [x - z if math.isfinite(x) else -math.inf for x in scores]


class PriorCache:
    """Log-likelihoods of answers on content-free states, per distinct question branches and content-free
    text, least recently used out first; the priors of any token rule and correction are derived from them.
    `score(text, branches)` runs the backend on the state `text`."""

    def __init__(self, size: int = 8192):
        self.size = size
        self._raw: OrderedDict[tuple[Branches, str], list[float]] = OrderedDict()

    def fill(
        self,
        wanted: Sequence[Branches],
        texts: Sequence[str],
        score: Callable[[str, list[Branches]], list[list[float]]],
    ) -> None:
        """Score what is not cached yet: one packed pass per content-free text."""
        for text in texts:
            missing = list(dict.fromkeys(b for b in wanted if (b, text) not in self._raw))
            if missing:
                self._raw.update({(b, text): s for b, s in zip(missing, score(text, missing))})

    def log_priors(
        self, scoring: Scoring, wanted: Sequence[Branches], score: Callable[[str, list[Branches]], list[list[float]]]
    ) -> list[list[float]]:
        """log p_cf per answer for each of `wanted` (branches as `scoring.branches` made them): the answer
        distributions on the correction's content-free states, averaged."""
        texts = CONTENT_FREE[scoring.correction]
        self.fill(wanted, texts, score)
        out = []
        for b in wanted:
            probs = [0.0] * len(b.answers)
            for text in texts:
                self._raw.move_to_end((b, text))
                for k, lp in enumerate(log_normalised(scoring.combine(b, self._raw[(b, text)]))):
                    probs[k] += math.exp(lp) / len(texts)
            out.append([math.log(p) if p > 0 else -math.inf for p in probs])
        while len(self._raw) > self.size:
            self._raw.popitem(last=False)
        return out


def corrected(scores: Sequence[float], log_prior: Sequence[float], weight: float = 1.0) -> list[float]:
    """score - λ·log p_cf. An answer impossible on every content-free state keeps its raw score (nothing to
    divide out), so a prior of 0 never turns into +inf."""
    return [s - weight * lp if math.isfinite(lp) else s for s, lp in zip(scores, log_prior)]


def with_opposite(p_yes: float, p_opposite_yes: float) -> float:
    """P(yes) for a yes/no question read together with the answer to its opposite about the same text ("Is
    this review positive?" with "Is this review negative?"): the mean of the two log-odds for the question,
    the opposite's negated. A lean both share (a model that says yes to both more often than the text
    warrants) cancels; the evidence each carries adds. It helps only where the model reads both questions
    the right way round: on the real-task suite the 1.5B's review verdicts go from 0.77-0.81 alone to
    0.88-0.92 paired, while an opposite it reads backwards ("Is this a legitimate email, not spam?") drags
    its pair to chance (docs/measurements/real-tasks.md, `python -m benchmarks.quality.tasks --report`)."""

    def scores(p: float) -> list[float]:
        p = min(max(p, 1e-12), 1 - 1e-12)
        return [math.log(p), math.log(1 - p)]

    yes, no = read_with_opposite(scores(p_yes), scores(p_opposite_yes))
    return 1 / (1 + math.exp(no - yes))


def split_opposites(questions: Mapping) -> tuple[dict, dict]:
    """The questions to ask: each yes/no question that names its opposite (`x_opposite`) becomes two, the
    question as written and its opposite (`Noul.opposite`) under the id (qid, "opposite"), which no request
    can use (a request's ids are strings). Each is asked isolated in the same pass, as any two questions
    are; an opposite that is also asked as a question of its own is scored once. Returns the questions and
    qid -> the opposite's id (the engine reads the two with `read_with_opposite`)."""
    asked, pairs = {}, {}
    for qid, q in questions.items():
        if isinstance(q, Noul) and q.x_opposite is not None:
            pairs[qid] = (qid, "opposite")
            asked[qid], asked[pairs[qid]] = q.alone(), q.opposite()
        else:
            asked[qid] = q
    return asked, pairs


def read_with_opposite(scores: Sequence[float], opposite: Sequence[float]) -> list[float]:
    """A yes/no question's scores (yes, no; log-scale) read with its opposite's, as `with_opposite` reads
    their probabilities: the mean of the two log-odds, the opposite's negated, as the scores (that, 0)."""
    return [((scores[0] - scores[1]) - (opposite[0] - opposite[1])) / 2, 0.0]
