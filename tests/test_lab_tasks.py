"""The real-task suite's draws (benchmarks/quality/suite.py, benchmarks/training/distill_tasks.py) on the Drugs.com
reviews it reads from a PyPI wheel: a label with fewer texts than asked gives all of them and the others as many
as asked; distillation rows with the unlabelled texts mixed in keep the labelled draw and carry gold null; a run in
another prompt format asks in that format and says so; runs of other cells are compared on the cells they share."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from benchmarks.data.drugs import CLINICS, other_condition_texts
from benchmarks.quality.suite import CONDITIONS, items
from benchmarks.quality.tasks import in_format, run_name, shared_cells
from benchmarks.training.distill_tasks import write_task
from prefill.schema import Noul

from .helpers import make_model

pytestmark = pytest.mark.slow  # the lab's runs, servers and downloads: the full tier


def test_a_small_label_gives_all_its_texts_and_the_others_as_many_as_asked():
    available = Counter(label for _, label in CONDITIONS.rows())
    assert set(available) == set(CLINICS) and min(available.values()) < 40 < max(available.values())
    drawn = items(CONDITIONS, 400, seed=0)  # 40 a label asked
    gold = Counter(next(a.gold for a in asked if a.qid == "clinic") for _, asked in drawn)
    for label, n in available.items():
        assert gold[list(CLINICS).index(label)] == min(n, 40), label
    assert len({text for text, _ in drawn}) == len(drawn)


def test_distill_rows_mix_in_the_unlabelled_texts(tmp_path):
    labelled, _ = write_task("conditions", 200, 1, tmp_path / "a")
    mixed, questions = write_task("conditions", 200, 1, tmp_path / "b", unlabelled=True)
    alone = [json.loads(line) for line in labelled.read_text().splitlines()]
    rows = [json.loads(line) for line in mixed.read_text().splitlines()]
    assert all(r["gold"] in [name for name, _ in CLINICS.values()] for r in alone)
    assert sorted(r["text"] for r in rows if r["gold"] is None) == sorted(other_condition_texts())
    assert sorted(json.dumps(r) for r in rows if r["gold"] is not None) == sorted(json.dumps(r) for r in alone)
    assert rows != alone + [r for r in rows if r["gold"] is None]  # mixed in, not appended
    assert list(json.loads(questions.read_text())) == ["clinic"]


def test_the_reports_own_calibration_undoes_each_questions_lean():
    """`--report`'s last table on rows made to lean: two yes/no phrasings that rank their texts right but lean
    opposite ways. Fitted on half the texts, per question fixes both on the other half; per type cannot."""
    import random

    from benchmarks.quality.suite import task_metrics
    from benchmarks.quality.tasks import own_calibration
    from prefill.scoring import DEFAULT

    rng, rows = random.Random(0), []
    for qid, lean in (("negative", 3.0), ("positive", -3.0)):
        for item in range(80):
            gold = int(item % 4 >= 2)  # both answers in each half (the halves are the even and odd texts)
            margin = (1.0 if gold == 0 else -1.0) + rng.gauss(0, 0.7) + lean  # yes minus no
            rows.append(
                {
                    "task": "reviews",
                    "qid": qid,
                    "type": "noul",
                    "item": item,
                    "gold": gold,
                    "readouts": {"whole": [margin, 0.0]},
                    "priors": {str(DEFAULT["noul"]): [0.0, 0.0]},
                }
            )
    served = dict(DEFAULT)
    per_type, per_question = (own_calibration(rows, served, q) for q in (False, True))
    for qid in ("negative", "positive"):
        mine = [i for i, r in enumerate(rows) if r["qid"] == qid]
        typed = task_metrics([rows[i] for i in mine], [per_type[i] for i in mine])["accuracy"]
        own = task_metrics([rows[i] for i in mine], [per_question[i] for i in mine])["accuracy"]
        assert typed < 0.7 < 0.8 < own


def test_the_reports_opposites_cancel_a_lean_they_share():
    """`--report`'s opposites table on rows made so: "Is this review positive?" and "... negative?" both carry
    the review's evidence, the right way round, and both lean to yes. Alone each says yes to nearly every
    review; read together the lean cancels and nearly every review is right."""
    import random

    from benchmarks.quality.tasks import opposites_table
    from prefill.scoring import DEFAULT

    rng, rows = random.Random(0), []
    for item in range(80):
        positive = item % 2 == 0
        evidence = (2.0 if positive else -2.0) + rng.gauss(0, 0.5)  # log-odds that the review is positive
        for qid, sign in (("positive", 1.0), ("negative", -1.0)):
            rows.append(
                {
                    "task": "fr_reviews",
                    "qid": qid,
                    "type": "noul",
                    "item": item,
                    "gold": 0 if positive == (qid == "positive") else 1,
                    "readouts": {"whole": [sign * evidence + 3.0, 0.0]},  # yes minus no, leaning yes by 3
                    "priors": {str(DEFAULT["noul"]): [0.0, 0.0]},
                }
            )
    table = opposites_table(rows, dict(DEFAULT))["fr_reviews|positive|negative"]
    assert table["alone"]["accuracy"] < 0.6 and table["opposite"]["accuracy"] < 0.6
    assert table["alone"]["auc"] > 0.95  # each ranks the reviews right: it is the lean that is wrong
    assert table["paired"]["accuracy"] > 0.95


def test_a_run_in_another_prompt_format_asks_in_it_and_names_it(tokenizer):
    model = make_model("qwen2", len(tokenizer))
    question = Noul(type="noul", instructions="Is it?")
    served, other = (in_format(model, tokenizer, "tiny", fmt).renderer for fmt in ("chat", "chat-truefalse"))
    decode = tokenizer.decode
    assert [decode(a) for a in served.question(question).answers][0].startswith("Yes")
    assert [decode(a) for a in other.question(question).answers][0].startswith("True")
    assert run_name({"model": "m", "format": "chat"}) == run_name({"model": "m"}) == "m"
    assert run_name({"model": "m", "format": "chat-truefalse"}) == "m, chat-truefalse"


def test_runs_of_other_cells_are_compared_on_the_cells_they_share():
    whole = dict.fromkeys([("spam", "noul"), ("spam", "choice"), ("drugs", "score")])
    part = dict.fromkeys([("messages", "noul"), ("drugs", "score"), ("spam", "noul")])
    shared, left_out = shared_cells([part, whole])
    assert shared == [("drugs", "score"), ("spam", "noul")]  # the first run's order
    assert left_out == [("messages", "noul"), ("spam", "choice")]
    assert shared_cells([whole, whole]) == (list(whole), [])


def _xz(path, stanzas: list[str]):
    import lzma

    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join(stanzas) + "\n")
    return path


def test_debian_descriptions_keep_one_program_a_source_as_a_user_reads_it(tmp_path, monkeypatch):
    """benchmarks/data/debian.py on a made-up archive index: a program of a kept section is kept once for its
    source package (its second binary, sharing the description, never reaches the other side of a split);
    libraries, -dev and -data packages, other sections and packages with no description are left out; the long
    description's paragraph marks become paragraphs and a long text is cut on a word."""
    from benchmarks.data import debian

    long_body = " ".join(["word"] * 200)
    files = {
        "packages": _xz(
            tmp_path / "Packages.xz",
            [
                "Package: chess\nSection: games\nDescription-md5: a",
                "Package: chess-net\nSource: chess (1.0)\nSection: games\nDescription-md5: a",
                "Package: libchess1\nSource: libchess\nSection: games\nDescription-md5: a",
                "Package: synth-dev\nSection: sound\nDescription-md5: b",
                "Package: synth-data\nSection: sound\nDescription-md5: b",
                "Package: synth\nSection: sound\nDescription-md5: b",
                "Package: shell\nSection: utils\nDescription-md5: b",
                "Package: undescribed\nSection: math\nDescription-md5: z",
                "Package: essay\nSection: editors\nDescription-md5: c",
            ],
        ),
        "descriptions": _xz(
            tmp_path / "Translation-en.xz",
            [
                "Package: chess\nDescription-md5: a\nDescription-en: plays chess\n Against you\n or itself.\n .\n"
                " Boards in  colour.",
                "Package: synth\nDescription-md5: b\nDescription-en: a synthesizer\n Makes sounds.",
                f"Package: essay\nDescription-md5: c\nDescription-en: an editor\n {long_body}",
            ],
        ),
    }
    monkeypatch.setattr(debian, "index_file", lambda which: files[which])
    rows = debian.package_rows()
    assert [section for _, section in rows] == ["games", "sound", "editors"]
    assert rows[0][0] == "plays chess\n\nAgainst you or itself.\n\nBoards in colour."
    assert rows[1][0] == "a synthesizer\n\nMakes sounds."
    cut = rows[2][0]
    assert len(cut) <= debian.MAX_CHARS + 4 and cut.endswith("word ...") and cut.startswith("an editor\n\nword")
