"""The fact pass: numeric and date comparisons answered exactly, by parsing instead of by the model.

Small models misjudge "is 1,500 at least 1,000?" and date differences with large margins. When a question
is one comparison ("Is the transaction amount at least $1,000?", "Was the account opened more than 90 days
ago?", "Is the invoice due before 2026-04-01?"), or a choice/score whose options are ranges of one quantity
("under $100" / "$100 to $1,000" / "over $1,000"), this pass finds the quantity in the state and answers
with certainty. It abstains (and the model answers as usual) whenever it is not sure what to compare:
no comparison, more than one clause, no quantity of the right kind in the state, or two quantities that fit
the question equally well. Questions it abstains on are not touched at all, so their answers are
byte-identical with the pass on or off.

Pure functions, no model: `decide(state_text, question, reference_date)` returns the answer's
distribution over the declared answers, or None.
"""

from __future__ import annotations

import datetime as dt
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .schema import AnyQuestion, Choice, Noul

# ---------------------------------------------------------------- quantities in text

_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        "january february march april may june july august september october november december".split()
    )
}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_MONTH = r"(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DATE = re.compile(
    r"\b(?P<iso>(?P<y1>\d{4})[-/](?P<m1>\d{1,2})[-/](?P<d1>\d{1,2}))\b"
    rf"|\b(?P<mdy>(?P<m2>{_MONTH})\s+(?P<d2>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<y2>\d{{4}}))\b"
    rf"|\b(?P<dmy>(?P<d3>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m3>{_MONTH}),?\s+(?P<y3>\d{{4}}))\b",
    re.IGNORECASE,
)

_DAYS_PER = {
    "second": 1 / 86400,
    "sec": 1 / 86400,
    "minute": 1 / 1440,
    "min": 1 / 1440,
    "hour": 1 / 24,
    "hr": 1 / 24,
    "day": 1,
    "week": 7,
    "month": 30.436875,
    "year": 365.2425,
    "yr": 365.2425,
}
_DURATION_UNIT = re.compile(
    r"(seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|yrs?)\b", re.IGNORECASE
)
_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mm": 1e6, "million": 1e6, "bn": 1e9, "b": 1e9, "billion": 1e9}
_NUMBER = re.compile(
    r"(?P<cur>[$€£]|\b(?:USD|EUR|GBP|CAD|AUD)\s?)?"
    r"(?<![\w.,#])(?<![A-Za-z]-)(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(?:(?P<scale>[kKmM]|[mM]{2}|bn)\b|\s(?P<word>thousand|million|billion)\b)?"
    r"(?P<pct>\s?%|\s(?:percent|per\s?cent)\b)?"
    r"(?P<cur2>\s?(?:USD|EUR|GBP|CAD|AUD|dollars?|euros?|pounds?)\b)?",
    re.IGNORECASE,
)

MONEY, PERCENT, DURATION, COUNT, DATE = "money", "percent", "duration", "count", "date"


@dataclass(frozen=True)
class Quantity:
    kind: str  # money | percent | duration (in days) | count (a bare number) | date (ordinal day)
    value: float
    start: int  # where it is in the text, for its context
    end: int


def parse_date(m: re.Match) -> dt.date | None:
    g = m.groupdict()
    try:
        if g["iso"]:
            return dt.date(int(g["y1"]), int(g["m1"]), int(g["d1"]))
        if g["mdy"]:
            return dt.date(int(g["y2"]), _MONTHS[g["m2"].lower().rstrip(".")], int(g["d2"]))
        return dt.date(int(g["y3"]), _MONTHS[g["m3"].lower().rstrip(".")], int(g["d3"]))
    except (ValueError, KeyError):
        return None


def quantities(text: str) -> list[Quantity]:
    """Every date, amount of money, percentage, duration and bare number in `text`, in order."""
    found, taken = [], []
    for m in _DATE.finditer(text):
        day = parse_date(m)
        if day:
            found.append(Quantity(DATE, day.toordinal(), m.start(), m.end()))
            taken.append(range(m.start(), m.end()))
    for m in _NUMBER.finditer(text):
        if any(m.start("num") in r for r in taken):
            continue
        value = float(m["num"].replace(",", ""))
        scale = (m["scale"] or m["word"] or "").lower()
        value *= _SCALE.get(scale, 1.0)
        end = m.end()
        if m["cur"] or m["cur2"]:
            kind = MONEY
        elif m["pct"]:
            kind = PERCENT
        elif scale in ("m", "mm") and not m["cur"]:
            continue  # "5m" without a currency is minutes or metres; not ours to guess
        else:
            unit = _DURATION_UNIT.match(text, end + 1) if text[end : end + 1] == " " else None
            if unit:
                kind, end = DURATION, unit.end()
                value *= _DAYS_PER[unit[1].lower().rstrip("s")]
            else:
                kind = COUNT
        found.append(Quantity(kind, value, m.start(), end))
    return sorted(found, key=lambda q: q.start)


# ---------------------------------------------------------------- words, for telling quantities apart

_STOP = set(
    """a an the is are was were be been being do does did has have had of for to in on at by with this that
these those it its any and or than more less over under above below least most no not there what which how
much many does customer's s ago since within last past before after from as per each than value number total
question answer yes whether""".split()
)


def words(text: str) -> set[str]:
    return set(_ordered_words(text))


_CLAUSE_END = re.compile(r"[.;]\s|[.;]$|\n|,\s|\b(?:and|but|while|whereas)\b", re.IGNORECASE)


def _ordered_words(text: str) -> list[str]:
    return [w.rstrip("s") for w in re.findall(r"[a-z]+", text.lower()) if w not in _STOP and len(w) > 1]


@dataclass(frozen=True)
class Context:
    """The words around a quantity in the state, within its clause: what it is the amount, age or date of."""

    near: frozenset[str]  # the clause's words on both sides
    label: frozenset[str]  # the last words before it ("Previous payment: $80", "is due on 2026-05-10")
    after: frozenset[str]  # the first words after it ("322 seats")


def context(text: str, q: Quantity, before: int = 48, after: int = 32) -> Context:
    left = _CLAUSE_END.split(text[max(0, q.start - before) : q.start])[-1]
    right = _CLAUSE_END.split(text[q.end : q.end + after])[0]
    left_words, right_words = _ordered_words(left), _ordered_words(right)
    return Context(frozenset(left_words + right_words), frozenset(left_words[-3:]), frozenset(right_words[:2]))


# ---------------------------------------------------------------- comparisons in questions

_OPS: list[tuple[str, Callable[[float, float], bool]]] = [
    (r"at least|no less than|not less than|a minimum of|>=|≥|or more", operator.ge),
    (r"at most|no more than|not more than|up to|<=|≤|or less|or fewer", operator.le),
    (
        r"more than|greater than|higher than|larger than|bigger than|in excess of|exceeds?|exceeding|over|above|"
        r"older than|longer than|>",
        operator.gt,
    ),
    (r"less than|fewer than|lower than|smaller than|younger than|shorter than|under|below|<", operator.lt),
    (r"exactly|equal to|equals", operator.eq),
]
_DATE_OPS = [
    (r"on or before|no later than|by", operator.le),
    (r"on or after|no earlier than", operator.ge),
    (r"before|earlier than|prior to", operator.lt),
    (r"after|later than", operator.gt),
    (r"on", operator.eq),
]
_CLAUSE = re.compile(r"\b(?:and|or|but|unless|if|because|while|nor|either)\b|,|;", re.IGNORECASE)


@dataclass(frozen=True)
class Condition:
    kind: str  # the kind of quantity it compares (count also matches money)
    test: Callable[[float], bool]
    subject: frozenset[str]  # the words that say what is compared
    age: bool = False  # compares a date's age (reference date − date), in days
    unit: frozenset[str] = frozenset()  # what a bare number counts ("more than 300 seats")


def _threshold(text: str) -> Quantity | None:
    qs = quantities(text)
    return qs[0] if len(qs) == 1 else None


def _range(t: str) -> Condition | None:
    """ "between $100 and $1,000", "$100 to $1,000", "100-1000": both ends inclusive."""
    qs = quantities(t)
    if len(qs) != 2 or DATE in (qs[0].kind, qs[1].kind):
        return None
    lo, hi = qs
    gap = t[lo.end : hi.start].strip().lower()
    lead = re.search(r"\b(between|from)\s*$", t[: lo.start], re.IGNORECASE)
    if not (gap in ("to", "-", "–", "—", "through") or (gap == "and" and lead)):
        return None
    if lo.kind == COUNT and hi.kind != COUNT and hi.kind != MONEY:
        return None  # "3 to 5 days": the unit is on one end only; not worth guessing
    residue = t[: lead.start() if lead else lo.start] + " " + t[hi.end :]
    if _CLAUSE.search(residue.replace("(inclusive)", "")):
        return None
    kind = hi.kind if lo.kind == COUNT else lo.kind
    return Condition(kind, lambda v, a=lo.value, b=hi.value: a <= v <= b, frozenset(words(residue)))


_RELATIVE = re.compile(
    r"\b(?P<op>more than|over|at least|less than|under|at most|within|in)"
    r"(?: the (?P<dir>last|past|next|coming))?\s+(?P<n>[\d,.]+)\s+(?P<unit>\w+?)s?\s*(?P<ago>ago|old)?\b",
    re.IGNORECASE,
)


def parse_condition(text: str) -> Condition | None:
    """A single comparison in `text`, or None when there is none or more than one clause."""
    t = " ".join(text.split())
    span = _range(t)
    if span:
        return span
    relative = _RELATIVE.search(t)
    for pattern, op in _OPS:
        m = re.search(rf"(?<![\w<>=])(?:{pattern})(?![\w<>=])", t, re.IGNORECASE)
        if m:
            return _comparison(t, m, op, relative)
    if relative and relative["op"].lower() in ("within", "in") and relative["unit"].lower() in _DAYS_PER:
        return _within(t, relative)
    return _date_comparison(t)


def _comparison(t: str, m: re.Match, op, relative: re.Match | None) -> Condition | None:
    """ "more than 3 failed logins", "over $1,000", "3 or more ...": the comparison `m` found in `t`."""
    tail = t[m.end() :]
    value_text = re.split(r"\?|$", tail, maxsplit=1)[0]
    head, rest = t[: m.start()], value_text
    threshold = _threshold(value_text)
    if "or more" == m[0].lower() or m[0].lower() in ("or less", "or fewer"):
        # "3 or more failed logins": the threshold comes before the words
        before = quantities(head)
        if not before:
            return None
        threshold, rest = before[-1], ""
        head = head[: threshold.start] + " " + head[threshold.end :] + " " + value_text
    if threshold is None:
        return None
    residue = head + " " + (rest[: threshold.start] + rest[threshold.end :] if rest else "")
    if _CLAUSE.search(residue.replace("(inclusive)", "")):
        return None
    negated = bool(re.search(r"\bnot\s*$", head, re.IGNORECASE)) and not m[0].lower().startswith("not ")
    age = threshold.kind == DURATION and bool(
        (relative and relative["ago"])
        or re.match(r"older|younger", m[0], re.IGNORECASE)
        or re.search(r"\b(old|age|ago|since|opened|created|joined|registered)\b", residue, re.IGNORECASE)
    )
    subject, unit = words(residue), frozenset()
    if threshold.kind == COUNT:  # "more than 3 failed logins": the words after say what is counted
        counted = rest[threshold.end :] if rest else value_text
        unit = frozenset(_ordered_words(counted)[:2])
        subject |= words(counted)
    test = lambda v, o=op, x=threshold.value, n=negated: o(v, x) != n
    return Condition(threshold.kind, test, frozenset(subject), age, unit)


def _within(t: str, relative: re.Match) -> Condition | None:
    """ "within the last 30 days", "in the next 2 weeks": an age inside a window."""
    n = float(relative["n"].replace(",", "")) * _DAYS_PER[relative["unit"].lower()]
    residue = t[: relative.start()] + " " + t[relative.end() :]
    if _CLAUSE.search(residue):
        return None
    ahead = (relative["dir"] or "").lower() in ("next", "coming")  # a date to come: its age is negative
    sign = -1 if ahead else 1
    test = lambda v, n=n, s=sign: 0 <= s * v <= n
    return Condition(DURATION, test, frozenset(words(residue)), age=True)


def _date_comparison(t: str) -> Condition | None:
    """ "before March 3, 2026", "after 2025-01-01": a comparison with one date."""
    for pattern, op in _DATE_OPS:
        m = re.search(rf"\b(?:{pattern})\s+(?={_DATE.pattern})", t, re.IGNORECASE)
        if not m:
            continue
        dates = [q for q in quantities(t[m.end() :]) if q.kind == DATE]
        residue = t[: m.start()]
        if len(dates) != 1 or _CLAUSE.search(residue):
            return None
        return Condition(DATE, lambda v, o=op, x=dates[0].value: o(v, x), frozenset(words(residue)))
    return None


# ---------------------------------------------------------------- reference date

_TODAY = re.compile(
    rf"\b(?:today(?:'s date)? is|today:|as of|current date(?: is|:)|date today(?: is|:)|"
    rf"reference date(?: is|:)|now is)\s*(?:{_DATE.pattern})",
    re.IGNORECASE,
)


def reference_date(state_text: str) -> tuple[dt.date, int] | None:
    """The date the state says it is today ("Today is 2026-03-10", "as of March 10, 2026"), and where."""
    m = _TODAY.search(state_text)
    inner = _DATE.search(state_text, m.start() + 1) if m else None
    day = parse_date(inner) if inner else None
    return (day, inner.start()) if day else None


# ---------------------------------------------------------------- matching and deciding


def _candidates(
    state_text: str, condition: Condition, today: dt.date | None, skip: int | None
) -> list[tuple[float, Context]]:
    """(value, context) of every quantity in the state the condition could compare: the same kind, money
    for a bare number that counts nothing in particular, and a date's age (days before the reference date).
    `skip` is where the state names the reference date, which is not a fact about anything."""
    out = []
    for q in quantities(state_text):
        if q.start == skip:
            continue
        ctx = context(state_text, q)
        if q.kind == MONEY:
            ctx = Context(ctx.near | {"amount"}, ctx.label, ctx.after)
        if q.kind == condition.kind or (condition.kind == COUNT and q.kind == MONEY and not condition.unit):
            out.append((q.value, ctx))
        elif condition.kind == DURATION and condition.age and q.kind == DATE and today:
            out.append((today.toordinal() - q.value, ctx))
    return out


def _pick(candidates: Sequence[tuple[float, Context]], condition: Condition) -> float | None:
    """The one candidate that fits the condition best: what it counts ("322 seats", not "$157 per seat"),
    then its label ("is due on", not "was issued on"), then the words around it, then the fewest label
    words the question does not have ("payment amount" is "Payment of $1,523", not "Previous payment:
    $80"). None when nothing fits or two fit equally well."""
    if len(candidates) <= 1:
        return candidates[0][0] if candidates else None
    subject, unit = condition.subject, condition.unit
    ranked = sorted(
        ((len(unit & c.after), len(subject & c.label), len(subject & c.near), -len(c.label - subject)), value)
        for value, c in candidates
    )
    (best, value), (second, _) = ranked[-1], ranked[-2]
    return value if sum(best[:3]) > 0 and best > second else None


def holds(state_text: str, condition: Condition, today: dt.date | None, skip: int | None = None) -> bool | None:
    value = _pick(_candidates(state_text, condition, today, skip), condition)
    return None if value is None else bool(condition.test(value))


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def decide(state_text: str, question: AnyQuestion, today: dt.date | None = None) -> list[float] | None:
    """The exact distribution over the question's declared answers, or None to let the model answer."""
    found = reference_date(state_text)
    skip = found[1] if found else None
    today = today or (found[0] if found else None)
    if isinstance(question, Noul):
        text = _text(question.instructions)
        if text is None and question.criteria is not None:
            text = _text(question.criteria.true)
        cond = parse_condition(text) if text else None
        truth = holds(state_text, cond, today, skip) if cond else None
        return None if truth is None else ([1.0, 0.0] if truth else [0.0, 1.0])
    subject = words(_text(question.instructions) or "")
    if isinstance(question, Choice):
        options = [
            _text(desc) if parse_condition(name) is None and desc else name for name, desc in question.criteria.items()
        ]
    else:
        options = list(question.criteria)
    truths = []
    for option in options:
        cond = parse_condition(option) if isinstance(option, str) else None
        if cond is None:
            return None
        cond = Condition(cond.kind, cond.test, cond.subject | subject, cond.age, cond.unit)
        truths.append(holds(state_text, cond, today, skip))
    if None in truths or sum(truths) != 1:
        return None
    return [1.0 if t else 0.0 for t in truths]
