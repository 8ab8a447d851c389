"""The default's answers to obvious spam and obvious ham e-mails (benchmarks/data/spamassassin.py
`obvious_emails`), asked the real-task suite's spam questions as served: P(spam) for each, and how many are right.

    python -m benchmarks.quality.obvious_spam --model qwen2.5-coder-1.5b-instruct"""

from __future__ import annotations

from benchmarks.data.spamassassin import obvious_emails


def ask_obvious(model: str, dtype: str) -> None:
    """The spam questions of the real-task suite (benchmarks/quality/tasks.py `spam_phrasings`) on the obvious
    e-mails, as served: P(spam) for each, and how many of each question's answers are right at 0.5."""
    from benchmarks.quality.suite import EMAILS
    from prefill import Prefill
    from prefill.evaluation.evaluate import parse_questions

    pf = Prefill(model, dtype=dtype)
    questions = parse_questions({p.qid: p.question for p in EMAILS.phrasings})
    right = dict.fromkeys(questions, 0)
    print(f"{model} ({pf.dtype}): P(spam) per question ({', '.join(questions)})")
    for text, is_spam in obvious_emails():
        answers = pf.ask(text, questions)
        p_spam = {
            "spam": answers["spam"].noul,
            "legit": 1 - answers["legit"].noul,
            "kind": answers["kind"].probabilities["spam"],
        }
        for qid, p in p_spam.items():
            right[qid] += (p > 0.5) == is_spam
        shown = " ".join(text.split())[:60]
        print(f"  {'spam' if is_spam else 'ham ':4} {' '.join(f'{p:.2f}' for p in p_spam.values())}  {shown}")
    print("right at 0.5: " + ", ".join(f"{qid} {n} of 6" for qid, n in right.items()))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="the default's answers to obvious spam and obvious ham")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    ask_obvious(args.model, args.dtype)
