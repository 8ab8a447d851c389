"""Generated labelled tasks of our own, for training and testing readouts beside sys1bench's policy tasks:

- routing: which of 8..16 teams with multi-token names ("Tax and Invoicing", "Developer API") should take a
  message (choice with many multi-token options), and yes/no "is this about <topic>?" (noul);
- upset: how upset a customer is on a five-level ordinal scale (score), and "is the customer angry?" (noul).

Gold answers come from the generator's own choices. Written as prefill's labelled JSONL:

    python -m benchmarks.data.generated --items 120 --seed 7 --out out/generated-train.jsonl
"""

from __future__ import annotations

import argparse
import random

from benchmarks.data.sys1bench import write_jsonl

TEAMS = {
    "Billing and Payments": [
        "I was charged twice this month",
        "my card payment keeps failing",
        "the refund for my order never arrived",
    ],
    "Account Security": [
        "someone logged into my account from another country",
        "I did not request this password reset",
        "my two-factor codes stopped working",
    ],
    "Shipping and Delivery": [
        "my parcel has been stuck in transit for a week",
        "the courier left the box at the wrong address",
        "tracking shows delivered but nothing came",
    ],
    "Mobile App": [
        "the iPhone app crashes when I open my basket",
        "the Android app will not let me log in",
        "push notifications from the app stopped",
    ],
    "Web Checkout": [
        "the checkout page spins forever after I click pay",
        "the discount code field on the website errors out",
        "I cannot select a delivery slot on the site",
    ],
    "Data Privacy": [
        "please delete all the personal data you hold on me",
        "I want a copy of my data under GDPR",
        "why are you sharing my email with partners",
    ],
    "Tax and Invoicing": [
        "my invoice is missing our VAT number",
        "I need a corrected invoice for accounting",
        "the sales tax on my invoice looks wrong",
    ],
    "Developer API": [
        "the REST API returns 429 errors for my key",
        "your webhook signatures do not validate",
        "the API docs for pagination are outdated",
    ],
    "Gift Cards": [
        "my gift card balance shows zero",
        "the gift card code I received is invalid",
        "can I combine two gift cards in one order",
    ],
    "Loyalty Program": [
        "my reward points did not post after my purchase",
        "how do I reach gold tier in the rewards club",
        "my loyalty points expired without notice",
    ],
    "Hardware Returns": [
        "the speaker I bought is defective and I want to return it",
        "how do I send back a broken router",
        "the replacement headphones also stopped working",
    ],
    "Subscriptions": [
        "I want to pause my monthly plan",
        "please switch my plan from monthly to annual",
        "my subscription renewed although I cancelled",
    ],
    "Accessibility": [
        "your site does not work with my screen reader",
        "the captions on your videos are missing",
        "I need larger text in the app for low vision",
    ],
    "Careers": [
        "I applied for the analyst job and have heard nothing",
        "are you hiring remote engineers",
        "can I update the CV in my job application",
    ],
    "Press and Media": [
        "I am a journalist asking for a comment on the outage",
        "can I interview your CEO for a podcast",
        "where can I find your press kit",
    ],
    "Partnerships": [
        "we would like to resell your product in Spain",
        "our company wants to integrate as a partner",
        "who handles affiliate partnerships",
    ],
}
TOPICS = {team: team.lower() for team in TEAMS}
NAMES = ["Priya", "Marco", "Aiko", "Lena", "Tomás", "Grace", "Omar", "Sven", "Noor", "Ada"]
OPENERS = ["Hi,", "Hello team,", "Good morning.", "Hey there,", ""]
CLOSERS = ["Thanks.", "Regards.", "Please advise.", "Cheers.", ""]

UPSET = [  # level: cue phrases, from calm to furious
    ["just a quick question when you have a moment", "no rush at all", "hope you are well"],
    ["this is a little inconvenient", "I am slightly disappointed", "a bit frustrating but fine"],
    ["I am annoyed that this keeps happening", "this is really frustrating", "I expected better than this"],
    ["I am angry about how this was handled", "this is unacceptable", "I am very upset and want it fixed today"],
    [
        "I am absolutely furious",
        "this is outrageous and I will never buy from you again",
        "I am livid and contacting my lawyer",
    ],
]
LEVELS = ["calm", "slightly annoyed", "annoyed", "angry", "furious"]


def routing(rng: random.Random) -> dict:
    gold = rng.choice(list(TEAMS))
    name = rng.choice(NAMES)
    state = " ".join(
        x
        for x in (rng.choice(OPENERS), rng.choice(TEAMS[gold]).capitalize() + ".", rng.choice(CLOSERS), f"- {name}")
        if x
    )
    others = rng.sample([t for t in TEAMS if t != gold], rng.randrange(7, 16))
    options = others + [gold]
    rng.shuffle(options)
    probe = gold if rng.random() < 0.5 else rng.choice(others)
    return {
        "family": "routing",
        "state": state,
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this message?",
                "criteria": {t: None for t in options},
            },
            "about": {"type": "noul", "instructions": f"Is this message about {TOPICS[probe]}?"},
        },
        "gold": {"team": gold, "about": probe == gold},
    }


def upset(rng: random.Random) -> dict:
    level = rng.randrange(len(LEVELS))
    team = rng.choice(list(TEAMS))
    state = f"{rng.choice(OPENERS)} {rng.choice(TEAMS[team]).capitalize()}. "
    "{rng.choice(UPSET[level]).capitalize()}. - {rng.choice(NAMES)}".strip()
    return {
        "family": "upset",
        "state": state,
        "questions": {
            "upset": {"type": "score", "instructions": "How upset is the customer?", "criteria": LEVELS},
            "angry": {"type": "noul", "instructions": "Is the customer angry?"},
        },
        "gold": {"upset": level, "angry": level >= 3},
    }


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [(routing if i % 2 == 0 else upset)(rng) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=120)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    write_jsonl(rows(args.items, args.seed), args.out)


if __name__ == "__main__":
    main()
