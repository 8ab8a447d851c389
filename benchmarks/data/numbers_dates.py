"""A generated threshold-and-date test set, for the fact pass (prefill/facts.py).

Each item is a short record (a payment, an invoice, a server alert, a subscription) with several amounts,
counts, percentages and dates, some of them distractors, and a reference date in the state. Questions:
single comparisons in many phrasings (thresholds set close to the true value, equality at the boundary),
range choices and scores, and control questions that involve no number (their gold answers come from the
record too) plus compound ones the fact pass must leave to the model. Gold answers come from the
generator's own values, never from parsing the text.

    python -m benchmarks.data.numbers_dates --items 120 --seed 3 --out out/numbers-dates.jsonl [--compare]
    prefill eval out/numbers-dates.jsonl --facts off --out out/eval-facts-off
    prefill eval out/numbers-dates.jsonl --facts on --out out/eval-facts-on
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random

from benchmarks.data.sys1bench import write_jsonl

NAMES = ["Priya", "Marco", "Aiko", "Lena", "Tomás", "Grace", "Omar", "Sven"]
METHODS = ["credit card", "bank transfer", "PayPal"]


def money(x: float, rng: random.Random) -> str:
    style = rng.randrange(4)
    if style == 0:
        return f"${x:,.2f}"
    if style == 1:
        return f"{x:,.0f} USD"
    if style == 2 and x >= 1000 and x % 100 == 0:
        return f"${x / 1000:g}k"
    return f"${x:,.0f}"


def date(d: dt.date, rng: random.Random) -> str:
    style = rng.randrange(3)
    if style == 0:
        return d.isoformat()
    if style == 1:
        return f"{d:%B} {d.day}, {d.year}"
    return f"{d.day} {d:%B} {d.year}"


def near(value: float, rng: random.Random, step: float = 1) -> float:
    """A threshold close to `value`: equal to it a fifth of the time, else within ±25%."""
    if rng.random() < 0.2:
        return value
    t = value * rng.uniform(0.75, 1.25)
    return max(step, round(t / step) * step)


def compare(rng: random.Random) -> tuple[str, object]:
    return rng.choice(
        [
            ("at least", lambda v, t: v >= t),
            ("more than", lambda v, t: v > t),
            ("over", lambda v, t: v > t),
            ("under", lambda v, t: v < t),
            ("less than", lambda v, t: v < t),
            ("at most", lambda v, t: v <= t),
            ("no more than", lambda v, t: v <= t),
            ("above", lambda v, t: v > t),
        ]
    )


def noul(text: str) -> dict:
    return {"type": "noul", "instructions": text}


def comparison(
    rng: random.Random,
    value: float,
    question: str,
    *,
    around: float | None = None,
    step: float = 1,
    as_money: bool = False,
) -> tuple[dict, bool]:
    """A yes/no question comparing `value` with a threshold near `around` (default: the value); `question`
    has {} where the comparison goes ("at least $1,200", "over 80"), and its gold answer."""
    word, test = compare(rng)
    t = near(value if around is None else around, rng, step)
    if not as_money:
        t = int(t)
    return noul(question.format(f"{word} {money(t, rng) if as_money else t}")), test(value, t)


def payment(rng: random.Random, today: dt.date) -> dict:
    amount = rng.choice([rng.randrange(20, 400), rng.randrange(500, 5000), rng.randrange(10, 200) * 100])
    previous = rng.randrange(10, 3000)
    paid = today - dt.timedelta(days=rng.randrange(0, 40))
    opened = today - dt.timedelta(days=rng.randrange(5, 900))
    method, name = rng.choice(METHODS), rng.choice(NAMES)
    state = (
        f"Payment of {money(amount, rng)} made on {date(paid, rng)} by {name} using {method}. "
        f"The customer's account was opened on {date(opened, rng)}. Previous payment: {money(previous, rng)}. "
        f"Today is {date(today, rng)}."
    )
    q, gold = {}, {}
    q["amount"], gold["amount"] = comparison(rng, amount, "Is the payment amount {}?", step=10, as_money=True)
    q["previous"], gold["previous"] = comparison(rng, previous, "Was the previous payment {}?", step=10, as_money=True)
    days = int(near((today - opened).days, rng))
    q["age"], gold["age"] = noul(f"Was the account opened more than {days} days ago?"), (today - opened).days > days
    cut = paid + dt.timedelta(days=rng.choice([-3, -1, 0, 1, 4]))
    q["before"], gold["before"] = noul(f"Was the payment made before {date(cut, rng)}?"), paid < cut
    recent = rng.choice([3, 7, 14, 30])
    q["recent"], gold["recent"] = (
        noul(f"Was the payment made within the last {recent} days?"),
        (today - paid).days <= recent,
    )
    bands = {"small": "under $100", "medium": "$100 to $1,000", "large": "over $1,000"}
    q["band"] = {"type": "choice", "instructions": "Which size band is the payment amount in?", "criteria": bands}
    gold["band"] = "small" if amount < 100 else "medium" if amount <= 1000 else "large"
    q["card"], gold["card"] = noul("Was the payment made by credit card?"), method == "credit card"
    t = near(amount, rng, 10)
    q["compound"] = noul(f"Is the payment amount over {money(t, rng)} and was it made by credit card?")
    gold["compound"] = amount > t and method == "credit card"
    return {"family": "payment", "state": state, "questions": q, "gold": gold}


def invoice(rng: random.Random, today: dt.date) -> dict:
    amount = rng.randrange(100, 20000)
    issued = today - dt.timedelta(days=rng.randrange(1, 90))
    due = issued + dt.timedelta(days=rng.choice([14, 30, 45, 60]))
    reminders, fee = rng.randrange(0, 6), rng.choice([1, 1.5, 2, 5, 10])
    state = (
        f"Invoice #{rng.randrange(1000, 9999)} for {money(amount, rng)} was issued on {date(issued, rng)} and is "
        f"due on {date(due, rng)}. {reminders} payment reminders have been sent. Late fee: {fee:g}% per month. "
        f"As of {date(today, rng)}, it has not been paid."
    )
    q, gold = {}, {}
    q["amount"], gold["amount"] = comparison(rng, amount, "Is the invoice amount {}?", step=50, as_money=True)
    n = max(1, int(near(reminders or 1, rng)))
    q["reminders"], gold["reminders"] = noul(f"Have {n} or more payment reminders been sent?"), reminders >= n
    cap = rng.choice([1, 2, 3, 5])
    q["fee"], gold["fee"] = noul(f"Is the late fee above {cap}%?"), fee > cap
    cut = due + dt.timedelta(days=rng.choice([-5, -1, 0, 2, 10]))
    q["due_by"], gold["due_by"] = noul(f"Is the invoice due on or before {date(cut, rng)}?"), due <= cut
    soon = rng.choice([7, 14, 30])
    q["soon"] = noul(f"Is the invoice due within the next {soon} days?")
    gold["soon"] = 0 <= (due - today).days <= soon
    q["paid"], gold["paid"] = noul("Has the invoice been paid?"), False
    return {"family": "invoice", "state": state, "questions": q, "gold": gold}


def alert(rng: random.Random, today: dt.date) -> dict:
    failed, cpu = rng.randrange(0, 30), rng.randrange(5, 100)
    uptime, disk = rng.randrange(1, 400), rng.randrange(10, 100)
    host = rng.choice(["web-01", "db-02", "cache-03", "api-04"])
    state = (
        f"Alert from {host}: {failed} failed login attempts in the last hour. CPU usage {cpu}%, disk usage "
        f"{disk}%. Uptime: {uptime} days. Report generated on {date(today, rng)}."
    )
    q, gold = {}, {}
    q["failed"], gold["failed"] = comparison(rng, failed, "Were there {} failed login attempts?", around=failed or 1)
    q["cpu"], gold["cpu"] = comparison(rng, cpu, "Is the CPU usage {}%?")
    t = int(near(disk, rng))
    q["disk"], gold["disk"] = noul(f"Is disk usage at least {t}%?"), disk >= t
    t = int(near(uptime, rng))
    q["uptime"], gold["uptime"] = noul(f"Is the uptime more than {t} days?"), uptime > t
    levels = ["under 50%", "50% to 80%", "over 80%"]
    q["load"] = {"type": "score", "instructions": "How loaded is the CPU?", "criteria": levels}
    gold["load"] = 0 if cpu < 50 else 1 if cpu <= 80 else 2
    q["db"], gold["db"] = noul("Is the alert about a database host?"), host.startswith("db")
    return {"family": "alert", "state": state, "questions": q, "gold": gold}


def subscription(rng: random.Random, today: dt.date) -> dict:
    months, seats = rng.randrange(1, 60), rng.randrange(1, 500)
    renews = today + dt.timedelta(days=rng.randrange(-10, 120))
    price = rng.randrange(5, 300)
    plan = rng.choice(["Starter", "Team", "Enterprise"])
    state = (
        f"{plan} plan, {seats} seats at {money(price, rng)} per seat per month. Customer for {months} months. "
        f"Renewal date: {date(renews, rng)}. Today's date is {date(today, rng)}."
    )
    q, gold = {}, {}
    q["seats"], gold["seats"] = comparison(rng, seats, "Does the customer have {} seats?")
    t = int(near(months, rng))
    q["tenure"], gold["tenure"] = noul(f"Has the customer been a customer for more than {t} months?"), months > t
    cut = renews + dt.timedelta(days=rng.choice([-7, -1, 0, 3, 20]))
    q["renews"], gold["renews"] = noul(f"Is the renewal date after {date(cut, rng)}?"), renews > cut
    lo, hi = sorted(int(near(price, rng)) for _ in range(2))
    q["price"] = noul(f"Is the price per seat between ${lo} and ${hi}?")
    gold["price"] = lo <= price <= hi
    q["enterprise"], gold["enterprise"] = noul("Is the customer on the Enterprise plan?"), plan == "Enterprise"
    return {"family": "subscription", "state": state, "questions": q, "gold": gold}


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    makers = [payment, invoice, alert, subscription]
    out = []
    for i in range(n):
        today = dt.date(2026, 1, 1) + dt.timedelta(days=rng.randrange(0, 700))
        out.append(makers[i % len(makers)](rng, today))
    return out


def compare_fact_pass(path: str, model: str | None = None) -> dict:
    """The default model with the fact pass on and off, split by whether the pass decided the question:
    accuracy of each group, and whether every undecided answer is the same either way."""
    from prefill import Prefill
    from prefill.evaluation.evaluate import gold_index, load_jsonl, vector
    from prefill.facts import decide
    from prefill.render import render_text

    items = load_jsonl(path)
    pf = Prefill(model)
    off = Prefill.from_backend(pf.backend, calibration=pf.engine.calibration, use_facts=False)
    groups = {"decided": [0, 0, 0], "left to the model": [0, 0, 0]}  # questions, right with facts off, on
    same = True
    for item in items:
        on_d = pf.engine.decide(item.state, item.questions, item.reference_date)
        off_d = off.engine.decide(item.state, item.questions, item.reference_date)
        for qid, q in item.questions.items():
            gold = gold_index(q, item.gold[qid])
            a, b = vector(off_d.answers[qid]), vector(on_d.answers[qid])
            is_decided = decide(render_text(item.state), q, item.reference_date) is not None
            g = groups["decided" if is_decided else "left to the model"]
            g[0] += 1
            g[1] += max(range(len(a)), key=a.__getitem__) == gold
            g[2] += max(range(len(b)), key=b.__getitem__) == gold
            if not is_decided:
                same &= max(abs(x - y) for x, y in zip(a, b)) <= 1e-4
    return {
        "items": len(items),
        **{
            k: {
                "questions": n,
                "accuracy_facts_off": round(r0 / max(n, 1), 3),
                "accuracy_facts_on": round(r1 / max(n, 1), 3),
            }
            for k, (n, r0, r1) in groups.items()
        },
        "undecided_answers_unchanged": same,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=120)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--compare",
        action="store_true",
        help="then answer it with the default model, fact pass on and off, and compare",
    )
    args = ap.parse_args()
    write_jsonl(rows(args.items, args.seed), args.out)
    if args.compare:
        print(json.dumps(compare_fact_pass(args.out), indent=2))


if __name__ == "__main__":
    main()
