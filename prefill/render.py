"""Rendering: from a state and a typed question to token ids, deterministically.

A request becomes a token tree: the state's tokens (the root, computed once), then for each question its
prompt tokens, then under each prompt one branch per declared answer. What the model sees for one
question never depends on the other questions, on their order, or on the question's id (ids are never
rendered), and the option list is shown in a canonical order (sorted by name), so the request's option
order cannot move any probability either.

Text from the caller is tokenized with special tokens split, so `<|im_end|>` typed by a user is plain
text to the model; only the chat template's own pieces may carry special tokens.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from .schema import AnyQuestion, Choice, Noul, Score

SYSTEM = (
    "You answer questions about a text. Read the text, then answer the question with exactly one of "
    "the allowed answers and nothing else."
)
_USER = "\x00USER\x00"
_REPLY = "\x00REPLY\x00"

YES, NO = "Yes", "No"
ANSWER_WORDS = {"yesno": (YES, NO), "truefalse": ("True", "False")}
# The prompt choices served by default (measured on real labelled text: docs/measurements/real-text.md).
DEFAULT_SYSTEM = True
DEFAULT_NOUL_WORDS = "yesno"
DEFAULT_SCORE_WORDS = "numbers"
SCORE_WORDS = ("numbers", "names")
DEFAULT_CHOICE_WORDS = "names"
CHOICE_WORDS = ("names", "numbers")


# ---------------------------------------------------------------- structured text


def render_text(value: Any, indent: int = 0) -> str:
    """Strings as they are; objects as `key: value` lines and arrays as `- item` lines, nested by
    indentation, in the caller's key order. Readable to a language model, and the same every time."""
    pad = "  " * indent
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:\n{render_text(v, indent + 1)}")
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for v in value:
            if isinstance(v, (dict, list)) and v:
                inner = render_text(v, indent + 1).lstrip()
                lines.append(f"{pad}- {inner}")
            else:
                lines.append(f"{pad}- {_scalar(v)}")
        return "\n".join(lines)
    return _scalar(value)


def _scalar(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (dict, list)):  # empty containers
        return json.dumps(v)
    return json.dumps(v, ensure_ascii=False)  # numbers, booleans, null


def _inline(value: Any) -> str:
    """A description on one option line: structured values rendered, then newlines folded."""
    return " ".join(render_text(value).split())


# ---------------------------------------------------------------- question text


@dataclass(frozen=True)
class Rendered:
    """One question as text: the prompt after the state, and the answer strings, one per option in
    the caller's order (choice: option names; noul: Yes, No; score: level numbers)."""

    prompt: str
    answers: tuple[str, ...]


def render_question(
    q: AnyQuestion,
    noul_words: str = DEFAULT_NOUL_WORDS,
    score_words: str = DEFAULT_SCORE_WORDS,
    choice_words: str = DEFAULT_CHOICE_WORDS,
) -> Rendered:
    if isinstance(q, Noul):
        return _render_noul(q, *ANSWER_WORDS[noul_words])
    if isinstance(q, Choice):
        return _render_choice(q, numbered=choice_words == "numbers")
    return _render_score_names(q) if score_words == "names" else _render_score(q)


def _question_line(q: AnyQuestion, default: str) -> str:
    """The question as asked, or the type's default when the request gives no instructions."""
    return f"Question: {render_text(q.instructions) if q.instructions is not None else default}"


def _render_noul(q: Noul, yes: str = YES, no: str = NO) -> Rendered:
    lines = [_question_line(q, "Does the description below hold for the text?")]
    crit = q.criteria
    if crit is not None and crit.true is not None:
        lines.append(f"{yes} means: {_inline(crit.true)}")
    if crit is not None and crit.false is not None:
        lines.append(f"{no} means: {_inline(crit.false)}")
    lines.append(f"Answer {yes} or {no}.")
    return Rendered("\n".join(lines), (yes, no))


def _render_choice(q: Choice, numbered: bool = False) -> Rendered:
    """Options listed sorted by name and answered by name, or (`numbered`) listed "1. name" and answered
    by that number, as a score's levels are."""
    lines = [
        _question_line(q, "Which option fits the text best?"),
        "Options:",
    ]
    names = sorted(q.criteria)  # canonical order: the request's option order must not matter
    for i, name in enumerate(names, 1):
        desc = _inline(q.criteria[name]) if q.criteria[name] is not None else ""
        mark = f"{i}." if numbered else "-"
        lines.append(f"{mark} {name}: {desc}" if desc else f"{mark} {name}")
    if numbered:
        lines.append("Answer with the number of exactly one option.")
        number = {name: str(i) for i, name in enumerate(names, 1)}
        return Rendered("\n".join(lines), tuple(number[name] for name in q.criteria))
    lines.append("Answer with the name of exactly one option.")
    return Rendered("\n".join(lines), tuple(q.criteria))


def _render_score(q: Score) -> Rendered:
    lines = [
        _question_line(q, "Which level fits the text best?"),
        "Levels:",
    ]
    lines += [f"{i}: {_inline(level)}" for i, level in enumerate(q.criteria)]
    lines.append("Answer with the number of exactly one level.")
    return Rendered("\n".join(lines), tuple(str(i) for i in range(len(q.criteria))))


def _render_score_names(q: Score) -> Rendered:
    """Levels answered by their own words ("Very angry") rather than their numbers, listed in order; a
    level with no words is answered by its number."""
    names = [_inline(level) or str(i) for i, level in enumerate(q.criteria)]
    lines = [
        _question_line(q, "Which level fits the text best?"),
        "Levels, from lowest to highest:",
    ]
    lines += [f"- {name}" for name in names]
    lines.append("Answer with exactly one level.")
    return Rendered("\n".join(lines), tuple(names))


# ---------------------------------------------------------------- the model's prompt format


@dataclass(frozen=True)
class PromptFormat:
    """The fixed text around the caller's text: `head` + state + `between` + question + `tail`, then an
    answer followed by `end`. With a chat template these come from the template itself (rendered around
    sentinels), so the prompt is exactly what the model was tuned on; without one, a plain format."""

    head: str
    between: str
    tail: str
    end: str

    @classmethod
    def plain(cls, bos: str = "", system: bool = True) -> PromptFormat:
        return cls(
            head=f"{bos}{SYSTEM}\n\nText:\n" if system else f"{bos}Text:\n", between="\n\n", tail="\nAnswer: ", end="\n"
        )

    @classmethod
    def from_chat_template(cls, tokenizer: Any, system: bool = True) -> PromptFormat:
        """`system`: the instruction as a system turn (folded into the user turn for templates that refuse
        one); without it, the user turn holds the text and the question only, and the template's own
        default system turn (if it has one) stands."""
        text_intro = "Text:\n"
        prompt = None
        if system:
            prompt = _apply(
                tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _USER}], True
            )
            if prompt is None or _USER not in prompt:  # templates that refuse a system turn
                text_intro = f"{SYSTEM}\n\nText:\n"
                prompt = None
        if prompt is None:
            prompt = _apply(tokenizer, [{"role": "user", "content": _USER}], True)
        if prompt is None or _USER not in prompt:
            raise ValueError("the chat template does not render a user turn")
        head, tail = prompt.split(_USER)
        full = _apply(tokenizer, [{"role": "user", "content": "x"}, {"role": "assistant", "content": _REPLY}], False)
        end = full.split(_REPLY, 1)[1].rstrip() if full and _REPLY in full else ""
        if not end:
            end = tokenizer.eos_token or "\n"
        return cls(head=head + text_intro, between="\n\n", tail=tail, end=end)


def _apply(tokenizer: Any, messages: list[dict], generation_prompt: bool) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception:  # noqa: BLE001 — a template that raises (e.g. on a system role) is tried another way
        return None


# ---------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Branches:
    """One question as tokens: the prompt that follows the state, and each answer's continuation
    (answer text plus the end-of-answer marker, whose last `end` tokens are the marker), in the caller's
    option order."""

    prompt: tuple[int, ...]
    answers: tuple[tuple[int, ...], ...]
    end: int = 0

    @property
    def n_tokens(self) -> int:
        return len(self.prompt) + sum(len(a) for a in self.answers)


class Renderer:
    """Turns states and questions into token ids for one tokenizer and prompt format.

    `system` (the instruction as a system turn), `noul_words` (yes/no questions answered "Yes"/"No" or
    "True"/"False"), `score_words` (levels answered by number or by name) and `choice_words` (options
    answered by name or by their number in the listing) are the prompt choices measured on real labelled
    text (benchmarks/quality/realtext.py, benchmarks/quality/tasks.py)."""

    def __init__(
        self,
        tokenizer: Any,
        chat: bool | None = None,
        system: bool = DEFAULT_SYSTEM,
        noul_words: str = DEFAULT_NOUL_WORDS,
        score_words: str = DEFAULT_SCORE_WORDS,
        choice_words: str = DEFAULT_CHOICE_WORDS,
    ):
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.chat = has_template if chat is None else (chat and has_template)
        if noul_words not in ANSWER_WORDS:
            raise ValueError(f"noul_words must be one of {', '.join(ANSWER_WORDS)}, not {noul_words!r}")
        if score_words not in SCORE_WORDS:
            raise ValueError(f"score_words must be one of {', '.join(SCORE_WORDS)}, not {score_words!r}")
        if choice_words not in CHOICE_WORDS:
            raise ValueError(f"choice_words must be one of {', '.join(CHOICE_WORDS)}, not {choice_words!r}")
        self.system, self.noul_words, self.score_words = system, noul_words, score_words
        self.choice_words = choice_words
        if self.chat:
            self.format = PromptFormat.from_chat_template(tokenizer, system)
        else:
            bos = tokenizer.bos_token if _adds_bos(tokenizer) else ""
            self.format = PromptFormat.plain(bos or "", system)

    def _encode(self, text: str, split_special: bool) -> list[int]:
        if not text:
            return []
        # Locked: HF fast tokenizers implement split_special_tokens by flipping a flag on the shared Rust
        # tokenizer, so concurrent calls could tokenize a template's <|im_end|> as plain text.
        with self._lock:
            return self.tokenizer(text, add_special_tokens=False, split_special_tokens=split_special).input_ids

    def _trusted(self, text: str) -> list[int]:
        return self._encode(text, split_special=False)

    def _user(self, text: str) -> list[int]:
        return self._encode(text, split_special=True)

    def count(self, text: str) -> int:
        return len(self._user(text))

    def state(self, state: Any) -> list[int]:
        return self._trusted(self.format.head) + self._user(render_text(state))

    def question(self, q: AnyQuestion) -> Branches:
        return self.branches(render_question(q, self.noul_words, self.score_words, self.choice_words))

    def branches(self, r: Rendered) -> Branches:
        """A rendered question's prompt and answers as token ids, in this prompt format."""
        prompt = self._user(self.format.between + r.prompt) + self._trusted(self.format.tail)
        end = self._trusted(self.format.end)
        return Branches(tuple(prompt), tuple(tuple(self._user(a) + end) for a in r.answers), len(end))


def _adds_bos(tokenizer: Any) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a").input_ids
    return bool(ids) and ids[0] == bos
