"""The spam task's e-mails are shown as a user would paste them (benchmarks/data/spamassassin.py): subject and readable
body, no routing headers, no HTML, cut at a word."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage

import pytest

from benchmarks.data.spamassassin import BODY_CHARS, readable

pytestmark = pytest.mark.slow  # the lab's runs, servers and downloads: the full tier

HEADERS = "Received: from mail.example.net (1.2.3.4)\nReturn-Path: <x@example.net>\n"


def parse(raw: str) -> email.message.Message:
    return email.message_from_bytes(raw.encode(), policy=email.policy.default)


def test_plain_message_keeps_subject_and_body_not_headers():
    text = readable(parse(HEADERS + "Subject: Re: backup  solutions\n\nUse Amanda.\n\n  It works.\n"))
    assert text == "Subject: Re: backup solutions\n\nUse Amanda. It works."


def test_html_alternative_prefers_plain_and_html_alone_is_stripped():
    m = EmailMessage()
    m["Subject"] = "Cash grants"
    m.set_content("plain version")
    m.add_alternative("<html><style>p {color: red}</style><p>Act <b>now</b> &amp; win</p></html>", subtype="html")
    assert readable(parse(m.as_string())).endswith("plain version")

    html_only = EmailMessage()
    html_only["Subject"] = "Cash grants"
    html_only.set_content("<html><style>p {color: red}</style><p>Act <b>now</b> &amp; win</p></html>", subtype="html")
    assert readable(parse(html_only.as_string())) == "Subject: Cash grants\n\nAct now & win"


def test_long_body_is_cut_at_a_word():
    body = " ".join(f"word{i}" for i in range(400))
    text = readable(parse(f"Subject: long\n\n{body}\n"))
    shown = text.split("\n\n", 1)[1]
    assert shown.endswith(" ...") and len(shown) <= BODY_CHARS + 4
    assert shown.removesuffix(" ...").split()[-1] in body.split()
