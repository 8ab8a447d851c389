"""The benchmark's requests (the SemIf ticket and its 21 questions; a newcomer's ticket, messages and first questions)
and how it times things. The lab (benchmarks/) and the tests ask these too."""

from __future__ import annotations

import os
import statistics
import threading
import time

from ..api import Prefill
from ..schema import Choice, Noul, Score

STATE = (
    "Ticket #88213 from Dana Whitfield (enterprise plan, customer since 2019, account in good standing). "
    "Subject: Charged twice, refund still missing, considering cancelling. "
    "Dana writes: On March 3rd I was charged $1,240 twice for our annual renewal (invoice INV-20931). Your billing "
    "agent, Marco, promised on March 5th that the duplicate charge would be refunded within five business days. "
    "It is now March 19th and nothing has arrived. I have emailed four times and called twice; each time I was "
    "told someone would get back to me, and nobody did. Meanwhile our finance team has flagged the duplicate and "
    "is asking me to explain it. I also noticed that since the update last week the export to CSV produces an "
    "empty file for reports longer than 30 days, which blocks our month-end close. Our team of 45 people depends "
    "on these exports. If the refund is not processed by Friday I will dispute the charge with our bank and we "
    "will move to a competitor at renewal. I would also like to know whether you offer a discount for moving to "
    "the multi-year plan, since we were considering it before all this happened. Please also make sure my "
    "colleague Priya Raman (priya.raman@example.com) is copied on all replies, as she handles our vendor "
    "payments. Attached: bank statement excerpt (PDF), screenshot of the empty export. "
    "Previous interactions: two tickets in the past year, both resolved within a day; satisfaction rating 5/5. "
    "Account notes: enterprise SLA requires a first response within 4 business hours; assigned CSM is Tom Okafor."
)

# A newcomer's ticket and first questions (the tests' regression examples on the default model, the lab's
# isolation checks).
TICKET = (
    "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
    "still hasn't arrived. Please fix this today or I will dispute the charge with my bank."
)
TICKET_QUESTIONS = {
    "refund": Noul("Is the customer asking for money back?"),
    "team": Choice(
        "Which team should handle this ticket?",
        {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages", "Sales": "Pricing"},
    ),
    "anger": Score("How frustrated is the customer?", ["Calm", "Frustrated", "Very angry"]),
    "kind": Choice("What kind of case is this?", ["fraud", "fraud review", "billing error"]),
}
NEWCOMER = {
    **{k: TICKET_QUESTIONS[k] for k in ("refund", "team", "anger")},
    "language": Choice("Which language is the message written in?", ["English", "French", "German"]),
}
THANKS = "Thank you so much, the support team fixed my login issue in minutes. Great service!"
BROKEN = "The package arrived broken and I want my money back."

QUESTIONS = [
    "Is the customer asking for money back?",
    "Was the customer charged more than once?",
    "Does the customer threaten to dispute the charge with a bank?",
    "Does the customer threaten to leave?",
    "Is the customer on an enterprise plan?",
    "Does the ticket report a software bug?",
    "Does the customer ask about pricing or discounts?",
    "Does the customer mention a deadline?",
    "Has the customer contacted support before about this issue?",
    "Is the customer angry or frustrated?",
    "Does the ticket mention an attachment?",
    "Does the customer ask to copy someone on replies?",
    "Is a specific invoice number mentioned?",
    "Is the customer asking to cancel immediately?",
    "Does the ticket mention a named support agent?",
    "Is the amount charged over $1,000?",
    "Does the issue block the customer's work?",
    "Is this the customer's first ticket ever?",
    "Does the customer praise the product?",
    "Does the ticket contain an email address?",
    "Should this ticket be escalated to a manager?",
]


# ---------------------------------------------------------------- measuring


class PeakMemory:
    """Peak resident memory above the starting point while the block runs (sampled every 2 ms)."""

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def mib(self) -> float:
        return round((self.peak - self.start) / 2**20, 1)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(fn, repeats: int, cold: Prefill | None = None) -> tuple[float, object]:
    """Median seconds over `repeats` runs after one warm-up (none for a single run: the long cases), and
    the last result. With `cold`, that engine's state cache is emptied before every run, so each run
    reads its state afresh."""

    def run():
        if cold is not None:
            cold.backend.forget_states()
        return fn()

    if repeats > 1:
        run()
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def tokens_ran(pf: Prefill, questions: dict) -> int:
    """The tokens the model really runs for one request on a fresh state (shared prompt prefixes once)."""
    before = pf.backend.tokens_run
    pf.backend.forget_states()
    pf.engine.ask(STATE, questions)
    return pf.backend.tokens_run - before


def nouls(n: int) -> dict[str, Noul]:
    return {
        f"q{i}": Noul(QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (item {i})")) for i in range(n)
    }
