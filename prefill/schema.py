"""The wire schema: TypeSafe System One requests and answers, as pydantic models.

This is the bottom layer: it knows nothing of models or serving. The engine takes these questions and
returns these answers; the server only adds HTTP around them. Validation here is what the official
API documents (2..255 choice options, 2..10 score levels, noul criteria with `true`/`false` only), so
a bad request fails as a 422 with FastAPI's `detail[]` shape before any model work starts.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

# Instructions, descriptions and the state may be a string, an object or an array (never a number or bool).
Text = Union[str, dict[str, Any], list[Any]]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]

MAX_CHOICE_OPTIONS = 255
# The API's documented limits: a request at most 64k tokens, and any one sequence a token sees (the state,
# a question, an answer) at most 32k; both configurable (settings.py), and the sequence never past the model's
# context.
DEFAULT_MAX_REQUEST_TOKENS = 65_536
DEFAULT_MAX_SEQUENCE_TOKENS = 32_768
MAX_SCORE_LEVELS = 10


class _Question(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def __init__(self, instructions: Text | None = None, criteria: Any = None, **data: Any):
        # Positional form for the Python API: Choice("Which team?", ["Billing", "Technical"]).
        if criteria is not None:
            data["criteria"] = criteria
        super().__init__(instructions=instructions, **data)

    @model_validator(mode="before")
    @classmethod
    def _opposite_is_for_yes_no(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("x_opposite") is not None and cls is not Noul:
            raise PydanticCustomError(
                "x_opposite", "x_opposite is for yes/no (noul) questions only: a choice or a score has no opposite"
            )
        return data


class NoulCriteria(BaseModel):
    """What counts as yes (`true`) and as no (`false`); either side may be left out."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    true: Text | None = None
    false: Text | None = None


class Noul(_Question):
    """A yes/no question or statement, answered as P(yes)."""

    type: Literal["noul"] = "noul"
    instructions: Text | None = None
    criteria: NoulCriteria | None = None
    # "Is this review negative?" for "... positive?" (scoring.split_opposites); absent from a dump when unset
    x_opposite: Text | None = Field(
        None,
        description="prefill's extension: the question's opposite (its yes is this question's no), asked in the "
        "same pass; the answer is P(yes) read from both (the mean of the two log-odds, the opposite's negated)",
    )

    @field_validator("x_opposite")
    @classmethod
    def _opposite_is_another_question(cls, value: Text | None, info: ValidationInfo) -> Text | None:
        if value is None:
            return value
        if not _wording(value):
            raise PydanticCustomError("x_opposite", "x_opposite must be a question, not empty")
        if _wording(value) == _wording(info.data.get("instructions")):
            raise PydanticCustomError(
                "x_opposite", "x_opposite must be the question's opposite, not the question itself"
            )
        return value

    @model_serializer(mode="wrap")
    def _without_unset_opposite(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if data.get("x_opposite") is None:
            data.pop("x_opposite", None)
        return data

    def opposite(self) -> Noul:
        """The opposite as a question of its own: `x_opposite` asked, what counts as yes and no swapped."""
        crit = self.criteria
        swapped = None if crit is None else NoulCriteria(true=crit.false, false=crit.true)
        return Noul(self.x_opposite, swapped)

    def alone(self) -> Noul:
        """The question as written, without its opposite."""
        return self.model_copy(update={"x_opposite": None})


def _choice_criteria(value: Any) -> Any:
    # The Python API also takes a list of option names; the wire form is always a mapping.
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        twice = sorted({v for v in value if value.count(v) > 1})
        if twice:
            raise ValueError(f"a choice's options must be distinct: {', '.join(map(repr, twice))} given twice")
        return {v: None for v in value}
    return value


def _wording(text: Text | None) -> str:
    """A question's wording, to compare two: stripped text, or JSON for an object or array."""
    if text is None:
        return ""
    return text.strip() if isinstance(text, str) else json.dumps(text, sort_keys=True, ensure_ascii=False)


class Choice(_Question):
    """One of 2..255 named options. Names are returned byte-for-byte; descriptions may be null."""

    type: Literal["choice"] = "choice"
    instructions: Text | None = None
    criteria: Annotated[dict[NonEmpty, Text | None], Field(min_length=2, max_length=MAX_CHOICE_OPTIONS)]

    def __init__(self, instructions: Text | None = None, criteria: Any = None, **data: Any):
        super().__init__(instructions, _choice_criteria(criteria), **data)


class Score(_Question):
    """One of 2..10 ordered levels (criteria[0] is level 0); the score is the expected level."""

    type: Literal["score"] = "score"
    instructions: Text | None = None
    criteria: Annotated[list[Text], Field(min_length=2, max_length=MAX_SCORE_LEVELS)]


Question = Annotated[Union[Noul, Choice, Score], Field(discriminator="type")]  # as the wire reads it
AnyQuestion = Noul | Choice | Score  # the same, for type hints and isinstance


def answer_labels(q: AnyQuestion) -> list[str]:
    """A question's answers by name, in declared order: yes, no; a choice's option names; a score's levels
    as "0", "1", ..."""
    if isinstance(q, Noul):
        return ["yes", "no"]
    if isinstance(q, Choice):
        return list(q.criteria)
    return [str(i) for i in range(len(q.criteria))]


# What the API has and a text model cannot read: refused with an error of this type, which the server sends as a
# 400 saying so (never an answer that ignores part of the request).
UNSUPPORTED = "unsupported_input"
NEEDS_IMAGES = (
    "{what} need a vision-language model, and prefill serves text models: it reads the state and the "
    "noul, choice and score questions as text, and cannot see an image"
)


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown top-level fields are ignored, as the API does
    model: str
    state: Text
    questions: Annotated[dict[NonEmpty, Question], Field(min_length=1)]
    # prefill's extension (x_-prefixed, so the contract stays clean): "today" for date questions.
    x_reference_date: dt.date | None = None
    # The API's image assets (placeholder -> image); declared so that a request with any is refused, not ignored.
    assets: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _what_a_text_model_cannot_read(cls, data: Any) -> Any:
        """Image assets and box questions ("where in the image"), refused with what they need."""
        if not isinstance(data, dict):
            return data
        questions = data.get("questions") if isinstance(data.get("questions"), dict) else {}
        boxes = [qid for qid, q in questions.items() if isinstance(q, dict) and q.get("type") == "box"]
        if data.get("assets"):
            raise PydanticCustomError(UNSUPPORTED, NEEDS_IMAGES.format(what="image assets"))
        if boxes:
            raise PydanticCustomError(
                UNSUPPORTED,
                NEEDS_IMAGES.format(what=f"box questions ({', '.join(map(repr, boxes))}: where in an image)"),
            )
        return data

    @field_validator("questions", mode="before")
    @classmethod
    def _choice_criteria_is_an_object(cls, questions: Any) -> Any:
        """On the wire a choice's criteria is an object of name -> description, exactly as the API documents
        (the official SDK's model too); the list shorthand is the Python API's only."""
        if isinstance(questions, dict):
            for qid, q in questions.items():
                if isinstance(q, dict) and q.get("type") == "choice" and not isinstance(q.get("criteria"), dict):
                    raise PydanticCustomError(
                        "dict_type",
                        "question {qid}: a choice's criteria must be an object of option name -> "
                        "description (null for none){example}",
                        {"qid": qid, "example": _as_object(q.get("criteria"))},
                    )
        return questions


def _as_object(criteria: Any) -> str:
    """For a list of option names sent where an object is due: the object to send instead."""
    if not isinstance(criteria, list) or not criteria or not all(isinstance(v, str) for v in criteria):
        return ""
    names = ", ".join(f"{json.dumps(v)}: null" for v in criteria[:3])
    return f", e.g. {{{names}{', ...' if len(criteria) > 3 else ''}}}"


class NoulAnswer(BaseModel):
    type: Literal["noul"] = "noul"
    noul: float


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    choice: str
    probabilities: dict[str, float]
    confidence: float


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    score: float
    legend: dict[str, Text]
    probabilities: dict[str, float]
    confidence: float


Answer = Union[NoulAnswer, ChoiceAnswer, ScoreAnswer]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class SystemOneResponse(BaseModel):
    model: str
    answers: dict[str, Answer]
    usage: Usage
    # prefill's extensions, x_-prefixed so the contract stays clean, and sent only when there is something to say
    x_low_confidence: list[str] = Field(
        default_factory=list,
        description="question ids whose confidence is under --fallback-below, with no fallback to answer them",
    )
    x_escalated: list[str] = Field(default_factory=list, description="question ids the fallback answered")
    x_truncated: list[str] = Field(
        default_factory=list, description="question ids read with the state cut to fit the model (encoder route)"
    )

    @model_serializer(mode="wrap")
    def _extensions_only_when_said(self, handler):
        return {k: v for k, v in handler(self).items() if not (k.startswith("x_") and not v)}


class ModelInfo(BaseModel):
    name: str
    description: str
    release_date: str


class ModelList(BaseModel):
    models: list[ModelInfo]


def wire_questions(raw: Any) -> dict[str, AnyQuestion]:
    """Questions given as JSON ({id: question}, as in a request): validated by exactly the request's rules."""
    return dict(SystemOneRequest.model_validate({"model": "-", "state": "", "questions": raw}).questions)
