"""The docs hold: README.md stays a front page (at most 300 lines), every relative link and #anchor in it, docs/
and the lab's index resolves, every `make X` and `prefill X` the README shows exists, docs/cli.md is what the
parser prints today, and the README's first request, sent as the README sends it (curl's body, the official
SDK's code, the Python API's code), is answered by a server on a tiny model in this process."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from .helpers import ROOT

README = ROOT / "README.md"
PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without its fenced code blocks (links in code are not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), flags=re.M):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_the_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 300


def test_the_anchors_are_githubs():
    assert slug("A process's first request") == "a-processs-first-request"
    assert slug("`--exact`") == "--exact"
    assert slug("A yes/no question with its opposite") == "a-yesno-question-with-its-opposite"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    broken = []
    for match in LINK.finditer(prose(page.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, broken


def test_every_make_target_and_prefill_command_the_readme_shows_exists():
    from prefill.commands import COMMANDS

    text = README.read_text()
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    made = set(re.findall(r"\bmake ([a-z][\w-]*)", text))
    assert made and made <= targets, made - targets
    shown = re.findall(r"^prefill ([a-z]+)", "".join(code_blocks(text, "sh")), flags=re.M)
    commands = {*shown, *re.findall(r"`prefill ([a-z]+)[ `]", prose(text))}
    assert {"serve", "ask", "batch", "calibrate", "train", "distill"} <= commands
    assert commands <= set(COMMANDS) | {"serve"}, commands - set(COMMANDS)


def test_the_cli_reference_is_what_the_parser_prints():
    from prefill.commands.reference import reference

    assert (ROOT / "docs" / "cli.md").read_text() == reference(), "docs/cli.md is stale: run `make docs`"


# ---------------------------------------------------------------- the README's first request, as it is written


@pytest.fixture(scope="module")
def served(model_dir):
    """A server on a tiny model in this process, as `prefill serve` would serve it: its URL."""
    from prefill import Prefill
    from prefill.bench.http import in_thread
    from prefill.serving.app import create_app

    with in_thread(create_app(Prefill(str(model_dir), calibration=None).engine)) as url:
        yield url


def test_the_readmes_curl_request(served):
    import httpx

    (curl,) = [block for block in code_blocks(README.read_text(), "sh") if block.startswith("curl")]
    args = shlex.split(curl.replace("\\\n", " "))
    url, body = args[args.index("-s") + 1], json.loads(args[args.index("-d") + 1])
    assert url == "localhost:8000/v1/systemone"
    r = httpx.post(f"{served}/v1/systemone", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert set(answers) == set(body["questions"]) == {"refund", "team", "anger"}
    assert answers["team"]["choice"] in body["questions"]["team"]["criteria"]
    shown = json.loads(code_blocks(README.read_text(), "json")[0])  # the answer the README shows has the same shape
    assert {k: {*v} for k, v in shown["answers"].items()} == {k: {*v} for k, v in answers.items()}


def test_the_readmes_sdk_code(served, capsys):
    (code,) = [block for block in code_blocks(README.read_text(), "python") if "typesafe_sdk" in block]
    assert 'base_url="http://localhost:8000"' in code
    exec(code.replace("http://localhost:8000", served), {})
    refund, team, anger = capsys.readouterr().out.split()
    assert 0 <= float(refund) <= 1 and team in ("Billing", "Technical") and 0 <= float(anger) <= 2


def test_the_readmes_python_code(model_dir, monkeypatch, capsys):
    """`Prefill()` in the README loads the default model; here the default is the tiny model."""
    from prefill import loading

    (code,) = [block for block in code_blocks(README.read_text(), "python") if "from prefill import" in block]
    monkeypatch.setattr(loading, "default_name", lambda dtype=None: str(model_dir))
    exec(code, {})
    p, team, anger = capsys.readouterr().out.split()
    assert 0 <= float(p) <= 1 and team in ("Billing", "Technical") and 0 <= float(anger) <= 2


def test_the_code_cites_docs_pages_that_exist():
    """Docstrings, comments and help texts cite docs/ pages (and their headings), never README sections."""
    cited, stale = set(), []
    for path in [*(ROOT / "prefill").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        text = path.read_text()
        stale += [f"{path.name}: {m}" for m in re.findall(r'README ["\'][^"\']+["\']', text)]
        for page, anchor in re.findall(r"(?<![\w./])(docs/[\w/-]+\.md)(?:#([\w-]+))?", re.sub(r"/\n\s*", "/", text)):
            cited.add((page, anchor))
    missing = [f"{p}#{a}" for p, a in cited if not (ROOT / p).is_file() or a and a not in anchors(ROOT / p)]
    assert cited and not missing and not stale, (missing, stale)


@pytest.mark.default_model
def test_the_answer_the_readme_shows_is_the_default_models(served_default):
    """The README's numbers are what `make serve` answers to its curl request (bf16 here; an AVX2 CPU runs the
    int8 model, whose answers may differ by a few hundredths: docs/models-and-precision.md)."""
    from fastapi.testclient import TestClient

    from prefill.serving.app import create_app

    (curl,) = [block for block in code_blocks(README.read_text(), "sh") if block.startswith("curl")]
    args = shlex.split(curl.replace("\\\n", " "))
    with TestClient(create_app(served_default.engine)) as client:
        got = client.post("/v1/systemone", json=json.loads(args[args.index("-d") + 1])).json()
    for page in (README, ROOT / "docs" / "http-api.md"):
        shown = next(json.loads(b) for b in code_blocks(page.read_text(), "json") if '"answers"' in b)
        assert shown["usage"] == got["usage"] and shown["model"] == got["model"], page
        for qid, answer in shown["answers"].items():
            for key in ("noul", "score", "confidence"):
                if key in answer:
                    assert abs(answer[key] - got["answers"][qid][key]) <= 0.03, (page, qid, key)
            for option, p in answer.get("probabilities", {}).items():
                assert abs(p - got["answers"][qid]["probabilities"][option]) <= 0.03, (page, qid, option)
            assert answer.get("choice") == got["answers"][qid].get("choice"), (page, qid)
