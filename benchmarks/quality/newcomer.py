"""A newcomer's first questions: obvious messages, asked as someone trying prefill would ask them.

Every stop tried `make serve` with a few obvious questions by hand; this makes that check a command, so the
numbers a user meets first can be rerun and cited. The messages are written to be obvious to any reader (a
refund demand, a thank-you note, a gift-card scam, a lunch invitation, a login problem, a quote request);
they are not real data, so nothing is tuned or chosen on them (the real-task suite, benchmarks/quality/tasks.py,
decides), and a miss here says what a newcomer will see, not how well a task is read. Each message's
questions go in one request, with the served defaults (prompt, scoring, calibration).

The one comparison it makes: routing to three teams by their names alone ("Billing", "Technical support",
"Sales") and with a one-line description of each, on the same tickets.

    python -m benchmarks.quality.newcomer --model qwen2.5-coder-1.5b-instruct    # about a minute here
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from prefill import Choice, Noul, Prefill, Score

TEAMS = ["Billing", "Technical support", "Sales"]
TEAM_REMITS = {
    "Billing": "invoices, charges, refunds, payment problems",
    "Technical support": "bugs, errors, login and access problems",
    "Sales": "prices, quotes, new purchases, upgrades",
}
LANGUAGES = ["English", "French", "German", "Spanish", "Italian"]
ROUTE = "Which team should handle this ticket?"
ASKED = {
    "refund": Noul("Is the customer asking for money back?"),
    "spam": Noul("Is this message spam?"),
    "sarcasm": Noul("Is this sarcastic?"),
    "language": Choice("Which language is this message written in?", LANGUAGES),
    "team, names": Choice(ROUTE, TEAMS),
    "team, remits": Choice(ROUTE, TEAM_REMITS),
    "anger": Score("How frustrated is the writer?", ["Calm", "Frustrated", "Very angry"]),
    "urgency": Score("How urgent is this?", ["Low", "Medium", "High"]),
    "stars": Score("How many stars would this reviewer give?", ["1", "2", "3", "4", "5"]),
}
# (message, {question: the answer any reader gives}); a score's answer is "high" or "low": its expected level
# above or below the middle of its scale.
TICKETS = [
    ("I was charged twice for order #4471 and the refund never arrived.", "Billing"),
    ("My invoice shows the wrong VAT number, please correct it.", "Billing"),
    ("I can't log in to my account, the password reset email never arrives.", "Technical support"),
    ("The app crashes every time I open the settings page.", "Technical support"),
    ("We'd like a quote for 200 licenses of your enterprise plan for our company.", "Sales"),
    ("Can you send me pricing for your premium plan? We are considering buying it.", "Sales"),
    ("I want to upgrade to the business plan, who can I talk to about a contract?", "Sales"),
    ("Do you offer discounts for non-profit organisations buying 50 seats?", "Sales"),
]
CASES = [
    ("The package arrived broken and I want my money back.", {"refund": "yes", "language": "English"}),
    ("Thank you so much, the support team fixed my login issue in minutes. Great service!", {"refund": "no"}),
    ("Hola, ¿a qué hora abre la tienda mañana?", {"language": "Spanish"}),
    ("Der Drucker im zweiten Stock funktioniert seit gestern nicht mehr.", {"language": "German"}),
    ("Bonjour, je voudrais changer l'adresse de livraison de ma commande.", {"language": "French"}),
    (
        "WINNER!! You have been selected to receive a $1000 gift card. Click http://bit.ly/xyz to claim it now!",
        {"spam": "yes"},
    ),
    (
        "URGENT: your account will be suspended. Verify your bank details at www.secure-verify-login.co today.",
        {"spam": "yes"},
    ),
    ("Hi Tom, are we still on for lunch tomorrow at noon? Let me know. - Sarah", {"spam": "no"}),
    ("The quarterly report is attached; please review section 3 before Thursday's meeting.", {"spam": "no"}),
    ("Oh great, another Monday. Just what I needed.", {"sarcasm": "yes"}),
    ("The meeting is scheduled for Monday at 10am in room 4.", {"sarcasm": "no"}),
    (
        "The server is down and all our customers are getting errors! Production is completely broken!!",
        {"urgency": "high", "anger": "high"},
    ),
    ("Just wanted to say thanks, everything works fine now.", {"urgency": "low", "anger": "low"}),
    ("This product is terrible, it broke after one day. Never buying again.", {"stars": "low"}),
    ("Absolutely love it! Best purchase I've made all year, works perfectly.", {"stars": "high"}),
    *[(text, {"team, names": team, "team, remits": team}) for text, team in TICKETS],
]


def answer_of(a, expected: str) -> tuple[str, bool]:
    """What the engine answered, as a reader would say it, and whether that is `expected`."""
    if a.type == "noul":
        said = "yes" if a.noul > 0.5 else "no"
        return f"{said} ({a.noul:.2f})", said == expected
    if a.type == "choice":
        return f"{a.choice} ({a.probabilities[a.choice]:.2f})", a.choice == expected
    middle = (len(a.probabilities) - 1) / 2
    said = "high" if a.score > middle else "low"
    return f"{said} ({a.score:.2f} of 0..{len(a.probabilities) - 1})", said == expected


def run(pf) -> str:
    from tqdm import tqdm

    lines = ["| message | question | a reader says | prefill says | right |", "|---|---|---|---|---|"]
    right, seconds = defaultdict(list), []
    for text, expected in tqdm(CASES, desc="newcomer", unit="message", file=sys.stderr):
        start = time.perf_counter()
        answers = pf.ask(text, {q: ASKED[q] for q in expected})
        seconds.append(time.perf_counter() - start)
        for q, want in expected.items():
            said, ok = answer_of(answers[q], want)
            right[q].append(ok)
            short = text if len(text) <= 60 else text[:57] + "..."
            lines.append(f"| {short} | {q} | {want} | {said} | {'yes' if ok else '**no**'} |")
    lines += ["", "| question | right |", "|---|---|"]
    lines += [f"| {q} | {sum(oks)} of {len(oks)} |" for q, oks in right.items()]
    total = [ok for oks in right.values() for ok in oks]
    lines.append(f"| all | {sum(total)} of {len(total)} |")
    seconds.sort()
    lines.append(
        f"\n{len(seconds)} requests, median {seconds[len(seconds) // 2]:.2f} s (each question's first ask included)"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="as prefill's --model (default: the embedded model)")
    ap.add_argument("--dtype", default="auto", help="as prefill's --dtype")
    args = ap.parse_args()
    print(f"newcomer: loading {args.model or 'the default model'} ...", file=sys.stderr, flush=True)
    pf = Prefill(args.model, dtype=args.dtype)
    pf.warm_up()  # as `prefill serve` does before it says it is ready
    print(run(pf))


if __name__ == "__main__":
    main()
