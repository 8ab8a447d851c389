"""Fallbacks that speak: the questions an engine is unsure of, re-asked to a server elsewhere.

Engine.decide hands a fallback the request's state and only the unsure questions; whatever the fallback
answers replaces the local answer (listed in `x_escalated`), and whatever it cannot answer (it is down,
slow, refuses, or says something that is not one of the declared answers) keeps the local answer and is
listed in `x_low_confidence`. A fallback never fails the request.

Two kinds, both over HTTP with one client and a timeout:
- SystemOneFallback: another System One server (a bigger prefill, or any compatible server), asked once
  with the unsure questions as given (`x_opposite` included: a prefill pairs them, a server without the
  extension answers the question alone), their ids and the reference date; its distributions are taken
  as they are.
- ChatFallback: an OpenAI-compatible chat endpoint (vLLM, transformers serve, llama.cpp, a hosted API),
  asked one question per chat request (so questions stay isolated from each other), with prefill's own
  prompt for the question, told to reply with one of the declared answers, and, for servers that honour
  it, held to them by a JSON schema whose answer is an enum (a yes/no question with `x_opposite`: the
  question and its opposite, two requests, read together as prefill reads them). The reply becomes a
  distribution:
  - with top logprobs (vLLM, llama.cpp's server, OpenAI): the model's own distribution over the declared
    answers, read where the answer starts (`answer_distribution`): the chosen answer gets exp(Σ logprob of
    the tokens that spell it), every other answer the probability of the alternative first tokens that
    begin it. Servers report these before the schema's grammar is applied (llama.cpp: the forced key
    "answer" at -7.5 where the model wanted "language"), so they are the model's belief, not the grammar's;
    answers outside the top ones share what the list leaves (each at most its smallest entry), and the
    whole is renormalised over the declared answers. Why: with the chosen answer's probability alone, a
    distilled student learnt from one-hot targets, and where the schema forced an answer the model gave
    under 1/n the reply said nothing at all (a quarter of the spam rows in docs/measurements/distillation.md);
  - with logprobs but no alternatives: the chosen answer gets p = exp(Σ logprob of its tokens) (at least
    the uniform 1/n, since it was the answer chosen) and the other answers share 1 - p evenly;
  - without: the chosen answer gets 1 - UNSCORED_MASS and the others share UNSCORED_MASS evenly (a
    generated answer carries no probability, so it is served as sure but not certain).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import httpx

from .render import SYSTEM, render_question, render_text
from .schema import AnyQuestion, Choice, Noul
from .scoring import split_opposites, with_opposite

log = logging.getLogger("prefill.fallback")
UNSCORED_MASS = 0.1
TOP_LOGPROBS = 20  # alternatives asked for at each reply token (the most OpenAI's API allows)


def unscored(k: int, n: int) -> list[float]:
    """The distribution served for a reply that names answer `k` of `n` and carries no probability."""
    return [1.0 - UNSCORED_MASS if i == k else UNSCORED_MASS / (n - 1) for i in range(n)]


def is_unscored(probs: list[float]) -> bool:
    """Whether `probs` is `unscored`'s form: a choice with no probability behind it, which says nothing
    about how sure the answerer was (a model's own distribution never lands on it exactly)."""
    n, k = len(probs), max(range(len(probs)), key=probs.__getitem__)
    return n > 1 and all(abs(p - q) < 1e-12 for p, q in zip(probs, unscored(k, n)))


class FallbackError(RuntimeError):
    """The fallback gave no usable answer; `kind` says how: "down" (no connection), "timeout", "status" (an
    error status: a refusal, an overload, a crash) or "unparseable" (a reply that is not JSON, has no
    message, or names no declared answer)."""

    KINDS = ("down", "timeout", "status", "unparseable")

    def __init__(self, message: str, kind: str = "unparseable"):
        super().__init__(message)
        self.kind = kind

    def reason(self) -> str:
        """How a journal records it: "kind: message" (`failure_kind` reads the kind back)."""
        return f"{self.kind}: {self}"


def failure_kind(reason: str) -> str:
    """The kind of a `FallbackError.reason()`, or "other" for any other error text."""
    kind = reason.split(":", 1)[0]
    return kind if kind in FallbackError.KINDS else "other"


def server_root(url: str) -> str:
    """A server's root from a base URL written either way: `http://host:8080` or, as OpenAI-compatible clients
    and vLLM's docs write it, `http://host:8080/v1` (the paths asked begin with /v1 themselves)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class _Remote:
    def __init__(self, url: str, *, model: str, api_key: str | None = None, timeout: float = 10.0):
        self.url = server_root(url)
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers)

    def _post(self, path: str, body: dict) -> dict:
        try:
            r = self.client.post(self.url + path, json=body)
        except httpx.HTTPError as e:
            kind = "timeout" if isinstance(e, httpx.TimeoutException) else "down"
            raise FallbackError(f"{self.url}{path}: {type(e).__name__}: {e}", kind) from e
        if r.status_code != 200:
            raise FallbackError(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:200]}", "status")
        try:
            return r.json()
        except ValueError as e:
            raise FallbackError(f"{self.url}{path}: the reply is not JSON") from e

    def probabilities(
        self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None = None
    ) -> tuple[dict[str, list[float]], int, list[str]]:
        """The distributions it could give (declared order; noul: yes, no), the tokens it reports, and no
        early exits: the Engine's fallback interface. Questions it could not answer are left out (logged)."""
        out, tokens, failed = self.answers(state, questions, reference_date)
        for qid, why in failed.items():
            log.warning("fallback %s: no usable answer for %r (%s)", self.url, qid, why)
        return out, tokens, []

    def answers(
        self, state: Any, questions: Mapping[str, AnyQuestion], reference_date: dt.date | None = None
    ) -> tuple[dict[str, list[float]], int, dict[str, str]]:
        """`probabilities` with why each question left out has no answer ({id: reason}), for callers that
        count and retry them (`prefill distill`). A failure of the whole request raises FallbackError."""
        raise NotImplementedError


class SystemOneFallback(_Remote):
    def __init__(self, url: str, *, model: str | None = None, **kw: Any):
        super().__init__(url, model=model or "jev-latest", **kw)

    def answers(self, state, questions, reference_date=None):
        body = {
            "model": self.model,
            "state": state,
            "questions": {qid: q.model_dump(mode="json", exclude_none=True) for qid, q in questions.items()},
        }
        if reference_date is not None:
            body["x_reference_date"] = reference_date.isoformat()
        reply = self._post("/v1/systemone", body)
        answers, out, failed = reply.get("answers") or {}, {}, {}
        for qid, q in questions.items():
            try:
                out[qid] = _distribution(q, answers[qid])
            except (KeyError, TypeError, ValueError) as e:
                failed[qid] = FallbackError(f"no usable answer: {type(e).__name__}: {e}").reason()
        return out, int((reply.get("usage") or {}).get("input_tokens") or 0), failed


def _distribution(q: AnyQuestion, answer: dict) -> list[float]:
    if isinstance(q, Noul):
        p = float(answer["noul"])
        probs = [p, 1.0 - p]
    elif isinstance(q, Choice):
        probs = [float(answer["probabilities"][name]) for name in q.criteria]
    else:
        probs = [float(answer["probabilities"][str(i)]) for i in range(len(q.criteria))]
    if not all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs) or abs(sum(probs) - 1.0) > 1e-3:
        raise ValueError(f"not a distribution over the declared answers: {probs}")
    return probs


class ChatFallback(_Remote):
    """`model`: the name the chat server serves (required: chat servers have no default)."""

    def __init__(self, url: str, *, model: str, **kw: Any):
        super().__init__(url, model=model, **kw)
        self.schema_ok = True  # cleared if the server refuses response_format
        self.logprobs_ok = True

    def answers(self, state, questions, reference_date=None):
        """A yes/no question with an opposite (`x_opposite`) is asked as two chat requests, the question and
        its opposite, and answered as prefill answers it: the two read together (`with_opposite`); if either
        has no answer, neither does the question (with that one's reason)."""
        asked, pairs = split_opposites(questions)
        got, tokens, failed = {}, 0, {}
        for qid, q in asked.items():
            try:
                got[qid], used = self.ask(state, q, reference_date)
                tokens += used
            except FallbackError as e:
                failed[qid] = e.reason()
        out, unanswered = {}, {}
        for qid in questions:
            both = (qid, pairs[qid]) if qid in pairs else (qid,)
            reason = next((failed[k] for k in both if k in failed), None)
            if reason is not None:
                unanswered[qid] = reason
            elif qid in pairs:
                p = with_opposite(got[qid][0], got[pairs[qid]][0])
                out[qid] = [p, 1.0 - p]
            else:
                out[qid] = got[qid]
        return out, tokens, unanswered

    def ask(self, state: Any, q: AnyQuestion, reference_date: dt.date | None = None) -> tuple[list[float], int]:
        rendered = render_question(q)
        answers = list(rendered.answers)
        today = f"Today is {reference_date.isoformat()}.\n\n" if reference_date else ""
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": f"{today}Text:\n{render_text(state)}\n\n{rendered.prompt}\n"
                    "Reply with exactly one of the allowed answers.",
                },
            ],
        }
        if self.logprobs_ok:
            body["logprobs"], body["top_logprobs"] = True, TOP_LOGPROBS
        if self.schema_ok:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"answer": {"type": "string", "enum": answers}},
                        "required": ["answer"],
                        "additionalProperties": False,
                    },
                },
            }
        try:
            reply = self._post("/v1/chat/completions", body)
        except FallbackError as e:
            if "HTTP 400" not in str(e) or not (self.schema_ok or self.logprobs_ok):
                raise
            # a server that refuses the schema or logprobs: ask plainly from now on
            self.schema_ok = self.logprobs_ok = False
            return self.ask(state, q, reference_date)
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise FallbackError("the reply has no message") from e
        k = parse_answer(text, answers)
        if k is None:
            raise FallbackError(f"the reply {text[:80]!r} is none of the declared answers {answers[:10]}")
        used = int((reply.get("usage") or {}).get("prompt_tokens") or 0)
        probs = answer_distribution(choice.get("logprobs"), text, answers, k)
        if probs is not None:
            return probs, used
        p = answer_probability(choice.get("logprobs"), text, answers[k])
        n = len(answers)
        if p is None:
            return unscored(k, n), used
        p = max(p, 1.0 / n)
        return [p if i == k else (1.0 - p) / (n - 1) for i in range(n)], used


def parse_answer(text: str, answers: list[str]) -> int | None:
    """Which declared answer a reply gives: a JSON {"answer": ...}, the answer alone (any case, quotes,
    bullet or final full stop), or a reply that starts with exactly one answer followed by a separator
    ("Billing: payments ..."). None when it is none of them, or ambiguous."""
    text = text.strip()
    try:
        value = json.loads(text)
        if isinstance(value, dict) and isinstance(value.get("answer"), str):
            text = value["answer"]
    except ValueError:
        pass
    bare = re.sub(r"^[-*\s\"'`]+|[\s\"'`.!]+$", "", text).casefold()
    folded = [a.casefold() for a in answers]
    if bare in folded:
        return folded.index(bare)
    starts = [i for i, a in enumerate(folded) if re.match(re.escape(a) + r"(\W|$)", bare)]
    longest = max((len(folded[i]) for i in starts), default=0)
    starts = [i for i in starts if len(folded[i]) == longest]
    return starts[0] if len(starts) == 1 else None


def _spelling(logprobs: dict | None, text: str, answer: str) -> tuple[list[dict], int, int] | None:
    """The OpenAI-style `logprobs.content` tokens that spell `answer` in the reply `text`, the offset of
    the first one in the text and where the answer starts; None when the server returned none or they do
    not line up with the text."""
    content = (logprobs or {}).get("content") if isinstance(logprobs, dict) else None
    start = text.casefold().find(answer.casefold())
    if not content or start < 0:
        return None
    end, pos, spelling, first = start + len(answer), 0, [], 0
    for tok in content:
        piece = tok.get("token", "")
        if pos < end and pos + len(piece) > start:
            first = pos if not spelling else first
            spelling.append(tok)
        pos += len(piece)
    if pos < end:  # the tokens do not spell the text
        return None
    return spelling, first, start


def answer_probability(logprobs: dict | None, text: str, answer: str) -> float | None:
    """exp(Σ logprob) of the tokens that spell `answer` in the reply `text`; None without logprobs."""
    found = _spelling(logprobs, text, answer)
    return None if found is None else math.exp(sum(float(t.get("logprob", 0.0)) for t in found[0]))


def _begins(token: str, answer: str) -> bool:
    """Whether a reply token could be the start of `answer` (or the whole of it and then punctuation)."""
    token, answer = token.casefold(), answer.casefold()
    return answer.startswith(token) or (token.startswith(answer) and not token[len(answer) :][:1].isalnum())


def answer_distribution(logprobs: dict | None, text: str, answers: list[str], chosen: int) -> list[float] | None:
    """The model's distribution over the declared answers, from the alternatives (`top_logprobs`) at the
    token where the chosen answer starts (see the module docstring); None without them."""
    found = _spelling(logprobs, text, answers[chosen])
    if found is None or not found[0][0].get("top_logprobs"):
        return None
    spelling, first, start = found
    lead = text[first:start]  # what the first token holds before the answer (a quote, a space), if anything
    head = spelling[0]
    p_chosen = math.exp(sum(float(t.get("logprob", 0.0)) for t in spelling))
    mass = [0.0] * len(answers)
    mass[chosen] = p_chosen
    seen = []
    for alt in head["top_logprobs"]:
        p, token = math.exp(float(alt.get("logprob", -math.inf))), alt.get("token", "")
        seen.append(p)
        rest = token[len(lead) :] if token.startswith(lead) else ""
        begun = [i for i, a in enumerate(answers) if rest and _begins(rest, a)]
        if token == head.get("token"):  # the chosen answer's own first token: what it did not take
            begun, p = [i for i in begun if i != chosen], max(0.0, p - p_chosen)
        for i in begun:
            mass[i] += p / len(begun)
    missing = [i for i, m in enumerate(mass) if m == 0.0]
    if missing and seen:
        each = min(min(seen), max(0.0, 1.0 - sum(seen)) / len(missing))
        for i in missing:
            mass[i] = each
    total = sum(mass)
    return [m / total for m in mass] if total > 0 else None


def check_remote(kind: str, model: str | None, model_flag: str = "--fallback-model") -> None:
    """A remote server described wrong, said before anything is loaded or asked; `model_flag` is the option
    that names the model in the caller's command (serve's fallback, distill's teacher)."""
    if kind not in ("systemone", "openai"):
        raise ValueError(f"the server kind must be systemone or openai, not {kind!r}")
    if kind == "openai" and not model:
        raise ValueError(f"an OpenAI-compatible server needs the model name it serves ({model_flag})")


def remote(url: str, kind: str = "systemone", model_flag: str = "--fallback-model", **kw: Any) -> _Remote:
    check_remote(kind, kw.get("model"), model_flag)
    return (ChatFallback if kind == "openai" else SystemOneFallback)(url, **kw)
