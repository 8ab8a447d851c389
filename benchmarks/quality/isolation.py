"""Does an answer move with how it is asked? The default model as `prefill serve` builds it (`--dtype auto`,
`--exact auto`), then plain (`--exact off`) in the same run, on one mixed request of the kind issue 59 found
moving by 0.063 in plain bf16: a card-fraud state, a 40-option category choice, options that share their first
tokens, options of many tokens, two scores, yes/no questions with criteria, a question and a state sentence in
Chinese. Each way of asking is compared with the request packed as sent, question by question:

- every question asked alone;
- the questions in reverse order;
- under other ids;
- each choice's options in another order (a score's levels keep theirs: their order is the scale);
- the request batched with two other requests in one shared pass (what the server does under load).

It prints the largest |dp| of each, per mode. Where the mode is exact every cell is 0; plain's row shows what
exactness removes (and that the comparison can see a move).

    python -m benchmarks.quality.isolation                                     # the default model, 3-6 min
    python -m benchmarks.quality.isolation --model qwen2.5-coder-0.5b-instruct --modes auto

Written up in docs/measurements/cpu-precision.md#exact-by-default.
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from prefill import Prefill
from prefill.bench.measure import BROKEN, TICKET
from prefill.schema import Choice, Noul, Score

STATE = (
    "Card transaction review. Cardholder: Mei Lin Zhang, Visa Platinum ending 4417, account opened 2016, home "
    "country Singapore, usual spending groceries and travel. Transaction: 2,380.00 EUR at 03:12 local time, "
    "merchant 'ELEKTRO-MARKT BERLIN 0231', card not present, online, shipping address in Lagos differs from the "
    "billing address. Four attempts within six minutes before it: 1.00 EUR (approved), 980.00 EUR (declined: "
    "CVV mismatch), 2,380.00 EUR (declined: 3-D Secure failed), then this one, approved after a password reset "
    "from a new device. 持卡人于今天早上打电话说她的手机丢了，并要求冻结她的卡。 The cardholder's last login "
    "before the reset was from Singapore, 14 hours ago."
)

CATEGORIES = [
    "groceries", "restaurants", "fast food", "coffee shops", "bars", "electronics", "computers and software",
    "mobile phones", "home appliances", "furniture", "clothing", "shoes", "jewellery", "watches", "cosmetics",
    "pharmacy", "hospital", "dentist", "airlines", "hotels", "car rental", "taxis and ride sharing", "public transport",
    "fuel", "parking", "tolls", "insurance", "utilities", "telecom", "streaming services", "video games", "books",
    "toys", "sporting goods", "pet supplies", "gardening", "gambling", "money transfer", "cryptocurrency exchange",
    "charity",
]  # fmt: skip

QUESTIONS = {
    "category": Choice("Which merchant category is this transaction?", CATEGORIES),
    "verdict": Choice(
        "What should happen to this transaction?",
        {
            "fraud": "block the card and refund the cardholder",
            "fraud review": "hold for an analyst to check",
            "fraudulent merchant": "report the merchant",
            "approve": "nothing looks wrong",
        },
    ),
    "channel": Choice(
        "How was the card used?",
        ["card present with chip and PIN", "card present, contactless", "card not present, online or by phone"],
    ),
    "risk": Score("How risky is this transaction?", ["very low", "low", "medium", "high", "very high"]),
    "urgency": Score("How urgently should the cardholder be contacted?", ["no need", "within a day", "now"]),
    "foreign": Noul(
        "Was the card used outside the cardholder's home country?",
        {"true": "the merchant or the shipping is abroad", "false": "everything is in the home country"},
    ),
    "velocity": Noul("Were there several attempts within a few minutes?"),
    "zh": Noul("这笔交易可能是欺诈吗？"),
}

OTHERS = [  # the two requests batched beside it
    (TICKET, {"refund": Noul("Is the customer asking for money back?"), **{k: QUESTIONS[k] for k in ("risk", "zh")}}),
    (BROKEN, {"verdict": QUESTIONS["verdict"], "category": QUESTIONS["category"]}),
]


def probabilities(answer) -> dict[str, float]:
    """An answer's distribution by option name (a yes/no's as {"yes": p})."""
    return {"yes": answer.noul} if answer.type == "noul" else dict(answer.probabilities)


def largest_move(a: dict, b: dict) -> float:
    return max(abs(p - b[name]) for name, p in a.items())


def shuffled_options(q, rng: random.Random):
    """The same question with a choice's options in another order (a score's levels are its scale)."""
    if not isinstance(q, Choice):
        return q
    names = list(q.criteria)
    while names == list(q.criteria):
        rng.shuffle(names)
    return Choice(q.instructions, {n: q.criteria[n] for n in names})


def moves(pf: Prefill) -> dict[str, float]:
    """The largest |dp| of each way of asking against the request packed as sent (its state cached after the
    first request, as a server keeps it; the batch from fresh states), each printed as it is measured."""
    rng = random.Random(0)
    decide = pf.engine.decide
    packed = {qid: probabilities(a) for qid, a in decide(STATE, QUESTIONS).answers.items()}
    out = {}

    def record(way: str, answers: dict[str, dict]) -> None:
        out[way] = max(largest_move(packed[qid], answers[qid]) for qid in QUESTIONS)
        print(f"  [{len(out)}/5] {way}: {out[way]:.1e}", flush=True)

    record("alone", {qid: probabilities(decide(STATE, {qid: q}).answers[qid]) for qid, q in QUESTIONS.items()})
    reversed_ = decide(STATE, dict(reversed(QUESTIONS.items()))).answers
    record("reversed", {qid: probabilities(a) for qid, a in reversed_.items()})
    names = {qid: f"q{i:02d}-{qid[::-1]}" for i, qid in enumerate(reversed(QUESTIONS))}
    renamed = decide(STATE, {names[qid]: q for qid, q in QUESTIONS.items()}).answers
    record("renamed", {qid: probabilities(renamed[names[qid]]) for qid in QUESTIONS})
    shuffled = decide(STATE, {qid: shuffled_options(q, rng) for qid, q in QUESTIONS.items()}).answers
    record("options shuffled", {qid: probabilities(a) for qid, a in shuffled.items()})
    pf.backend.forget_states()
    batch = pf.engine.decide_many([OTHERS[0] + (None,), (STATE, QUESTIONS, None), OTHERS[1] + (None,)])
    record("batched", {qid: probabilities(a) for qid, a in batch[1].answers.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="the default model when left out (the one --dtype auto picks)")
    ap.add_argument("--dtype", default="auto", help="the precision (default auto: what `prefill serve` picks)")
    ap.add_argument("--modes", default="auto,off", help="--exact values to run, in this order (default auto,off)")
    args = ap.parse_args()
    rows = []
    for mode in args.modes.split(","):
        started = time.perf_counter()
        print(f"loading {args.model or 'the default model'} (--dtype {args.dtype}, --exact {mode})", flush=True)
        pf = Prefill(args.model, dtype=args.dtype, exact=mode, calibration=None)
        print(f"  {pf.backend.description}; asking as sent, then 5 other ways", flush=True)
        got = moves(pf)
        rows.append((mode, pf.backend.description, got))
        print(f"  done in {time.perf_counter() - started:.0f} s", flush=True)
        del pf
        gc.collect()
    print("\n| `--exact` | served as | " + " | ".join(rows[0][2]) + " |")
    print("|---|---|" + "---|" * len(rows[0][2]))
    for mode, described, got in rows:
        print(f"| {mode} | {described} | " + " | ".join(f"{v:.1e}" if v else "**0**" for v in got.values()) + " |")


if __name__ == "__main__":
    main()
