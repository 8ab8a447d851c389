"""The real-text suite's commands as docs/measurements/ gives them, end to end on a tiny random model (a model
directory built here): a run scores and reports, and two runs compare. A report that no longer runs (a name
renamed in prefill) fails here rather than at the end of an hour's run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from prefill import precision

from .helpers import make_model

pytestmark = pytest.mark.slow  # the lab's runs, servers and downloads: the full tier


def saved_tiny(tmp_path, tokenizer):
    """A tiny random Qwen2 saved as a model directory, as a lab module's --model reads one."""
    model = tmp_path / "model"
    make_model("qwen2", len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    return model


def lab(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m benchmarks.MODULE ARGS`, as docs/measurements/ runs it."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args], capture_output=True, text=True, timeout=600
    )


def realtext(*args: str) -> subprocess.CompletedProcess:
    return lab("quality.realtext", *args)


def test_a_realtext_run_reports_and_compares(tmp_path, tokenizer):
    model = saved_tiny(tmp_path, tokenizer)
    common = ["--model", str(model), "--items", "4", "--tasks", "fr_reviews,spam", "--formats", "chat"]
    for dtype in ("float32", "bfloat16"):
        run = realtext(*common, "--synthetic", "0", "--dtype", dtype, "--out", str(tmp_path / dtype))
        assert run.returncode == 0, run.stderr[-3000:]
        assert "## model: 4 texts a task" in run.stdout and "| noul |" in run.stdout
    compared = realtext("--compare", str(tmp_path / "float32"), str(tmp_path / "bfloat16"))
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert "| mean | all |" in compared.stdout


@pytest.mark.skipif(not precision.has_bf16_units(), reason="bf16 runs on a CPU with bf16 units")
def test_an_isolation_run_finds_exact_bf16_unmoved_and_plain_bf16_moved(tmp_path, tokenizer):
    """benchmarks.quality.isolation on a tiny model in bf16: every way of asking gives the exact mode's answers to
    the bit, and plain bf16's row shows a move (the comparison can see one)."""
    model = saved_tiny(tmp_path, tokenizer)
    run = lab("quality.isolation", "--model", str(model), "--dtype", "bfloat16")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line.split(" | ") for line in run.stdout.splitlines()]
    rows = {cells[0]: cells[2:] for cells in lines if cells[0] in ("| auto", "| off")}
    assert set(rows) == {"| auto", "| off"}, run.stdout
    assert all(cell.strip(" |") == "**0**" for cell in rows["| auto"]), run.stdout
    assert any(cell.strip(" |") != "**0**" for cell in rows["| off"]), run.stdout


def test_an_opposites_run_asks_each_opposite_as_served(tmp_path, tokenizer):
    """benchmarks.quality.opposites as docs/measurements/ runs it: every reading from one request a text, the paired
    answer (`x_opposite`, served) the question and its opposite read together, and the table from the saved run."""
    from prefill import with_opposite

    model = saved_tiny(tmp_path, tokenizer)
    cmd = [sys.executable, "-m", "benchmarks.quality.opposites", "--model", str(model), "--dtype", "float32"]
    run = subprocess.run(
        [*cmd, "--items", "4", "--tasks", "fr_reviews,spam", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert list(results) == ["fr_reviews", "spam"] and len(results["spam"]["opposites"]) == 3
    for row in results["spam"]["rows"]:
        for i in range(3):
            want = with_opposite(row["p"]["alone"], row["p"][f"opposite {i}"])
            assert abs(row["p"][f"paired {i}"] - want) < 1e-6
    again = subprocess.run([*cmd, "--report", str(tmp_path / "o")], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout == run.stdout
    assert '"Is this a legitimate email?"' in run.stdout and "| fr_reviews |" in run.stdout
    bad = subprocess.run([*cmd, "--tasks", "sarcasm"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "sarcasm not one of" in bad.stderr


def test_a_distillation_run_then_the_student_and_teacher_timed_in_turn(tmp_path, tokenizer):
    """benchmarks.training.distill_tasks as docs/measurements/ runs it (a tiny teacher loaded here, a tiny student with
    a head), then `--time-teacher N --model STUDENT`: both timed on the same rows in one process, with the ratio."""
    model = saved_tiny(tmp_path, tokenizer)
    common = ["--teacher-model", str(model), "--tasks", "fr_reviews", "--out", str(tmp_path / "run")]
    cmd = [sys.executable, "-m", "benchmarks.training.distill_tasks", *common]
    run = subprocess.run([*cmd, "--rows", "10", "--model", str(model)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "fr_reviews" / "final.json").exists()
    timed = subprocess.run(
        [*cmd, "--time-teacher", "3", "--model", str(model)], capture_output=True, text=True, timeout=600
    )
    assert timed.returncode == 0, timed.stderr[-3000:]
    for line in ("fr_reviews: the teacher alone", "fr_reviews: the student alone", "x the teacher's speed"):
        assert line in timed.stdout, timed.stdout
    assert timed.stderr.count("fr_reviews: row ") == 3 and "student " in timed.stderr


def fastpath_on_a_tiny_model(tmp_path, tokenizer, flag: str) -> list[str]:
    """`python -m benchmarks.speed.fastpath FLAG MODEL` on a tiny Qwen2 model: the lines it prints."""
    model = saved_tiny(tmp_path, tokenizer)
    cmd = [sys.executable, "-m", "benchmarks.speed.fastpath", flag, str(model)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_a_profile_of_the_semif_request_by_operator(tmp_path, tokenizer):
    """benchmarks.speed.fastpath --profile as docs/measurements/ runs it: the request's operators, largest first, their
    shares summing to at most 100 %, and the products' rate against a bare linear layer timed then."""
    lines = fastpath_on_a_tiny_model(tmp_path, tokenizer, "--profile")
    assert "the SemIf request (21 questions," in lines[0]
    ops = [line for line in lines[1:] if line.startswith("  ")]
    seconds = [float(line.split()[-5]) for line in ops]
    assert len(ops) >= 5 and seconds == sorted(seconds, reverse=True)
    assert sum(float(line.split()[-3]) for line in ops) <= 100.5
    assert lines[-1].startswith("matrix products: ") and "a bare linear layer in bf16 now: " in lines[-1]


def test_the_element_wise_work_fused_by_torch_compile_answers_as_eager(tmp_path, tokenizer):
    """benchmarks.speed.fastpath --fused as docs/measurements/ runs it (fp32 here, the suite's precision): the
    compile's cost, both paths' seconds, and the fused kernels' answers equal to the eager ones and still isolated."""
    lines = fastpath_on_a_tiny_model(tmp_path, tokenizer, "--fused")
    assert "compiling the fused kernels" in lines[0]
    assert lines[1].startswith("eager (served): SemIf 21 questions ") and lines[2].startswith("fused: SemIf 21 ")
    moved, isolated = (float(part.split()[-1]) for part in lines[3].split(";"))
    assert moved < 1e-5 and isolated < 1e-5  # other kernels, the same arithmetic: fp32 rounding only


def side_benchmark(tmp_path, tokenizer, module: str):
    """benchmarks.MODULE on a tiny model saved here: a function running it with more arguments."""
    model = saved_tiny(tmp_path, tokenizer)
    cmd = [sys.executable, "-m", f"benchmarks.{module}", "--model", str(model), "--dtype", "float32"]
    return lambda *args: subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600)


def test_an_option_order_run_asks_each_choice_in_both_orders(tmp_path, tokenizer):
    """benchmarks.quality.option_order as docs/measurements/ runs it: every choice question of the chosen tasks asked
    with its options as served and reversed, the same questions in each, and the table from the saved run."""
    bench, out = side_benchmark(tmp_path, tokenizer, "quality.option_order"), tmp_path / "o"
    run = bench("--items", "4,language=8", "--tasks", "fr_reviews,language", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    keys = {o: [(r["task"], r["qid"], r["item"]) for r in rows if r["order"] == o] for o in ("sorted", "reversed")}
    assert keys["sorted"] == keys["reversed"] and {r["type"] for r in rows} == {"choice"}
    assert {k[0] for k in keys["sorted"]} == {"fr_reviews", "language"}
    # a random model reads the two listings otherwise: the orders are not the same prompt
    by = {(r["order"], r["task"], r["qid"], r["item"]): r["readouts"]["whole"] for r in rows}
    assert any(by[("sorted", *k)] != by[("reversed", *k)] for k in keys["sorted"])
    again = bench("--report", str(out))
    assert again.returncode == 0 and again.stdout == run.stdout
    assert "| language | which |" in run.stdout and "| mean over phrasings |" in run.stdout
    bad = bench("--tasks", "sarcasm", "--out", str(out))
    assert bad.returncode == 2 and "sarcasm not one of" in bad.stderr


def test_options_listed_in_reverse_keep_the_answers_and_the_question():
    """benchmarks.quality.option_order's reversed listing: only the option lines move, the answers stay in the
    caller's order, both orders read together are a distribution that sides with the two where they agree, and
    the escalation columns count what they say."""
    from benchmarks.quality.option_order import both_orders, escalation, listed_in_reverse, top
    from prefill.render import render_question
    from prefill.schema import Choice

    q = Choice(instructions="Which team?", criteria={"Sales": None, "Billing": "Invoices, refunds", "Tech": None})
    served = render_question(q)
    rev = listed_in_reverse(served)
    assert rev.answers == served.answers == ("Sales", "Billing", "Tech")
    assert served.prompt.split("\n")[2:5] == ["- Billing: Invoices, refunds", "- Sales", "- Tech"]
    assert rev.prompt.split("\n")[2:5] == ["- Tech", "- Sales", "- Billing: Invoices, refunds"]
    assert rev.prompt.split("\n")[:2] == served.prompt.split("\n")[:2]
    assert rev.prompt.split("\n")[-1] == served.prompt.split("\n")[-1]
    both = both_orders([0.7, 0.2, 0.1], [0.5, 0.1, 0.4])
    assert abs(sum(both) - 1) < 1e-12 and top(both) == 0 and both[2] > 0.1
    # (confidence, right, the orders agree): 3 of 4 agree, 2 of those right; the 3 most confident, 1 right
    kept = escalation([(0.9, True, True), (0.8, False, False), (0.3, True, True), (0.6, False, True)])
    assert kept == {"moved": 0.25, "agreeing": 2 / 3, "most_confident": 1 / 3}


def test_a_one_vs_rest_run_asks_one_yes_no_per_destination(tmp_path, tokenizer):
    """benchmarks.quality.one_vs_rest as docs/measurements/ runs it: each routing text asked one yes/no question per
    destination in every form, beside the two choice phrasings, and the table from the saved run."""
    from benchmarks.quality.one_vs_rest import FORMS, routed, table

    bench, out = side_benchmark(tmp_path, tokenizer, "quality.one_vs_rest"), tmp_path / "o"
    run = bench("--items", "12", "--tasks", "lists", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(len(r[form]) == 6 for r in rows for form in [*FORMS, "route", "team"])
    assert all(abs(sum(r["route"]) - 1) < 1e-6 for r in rows)
    m = table(rows)["lists"]
    assert m["about, name"] == sum(routed(r["about, name"]) == r["gold"] for r in rows) / 12
    again = bench("--report", str(out))
    assert again.returncode == 0 and again.stdout == run.stdout and "| lists | 12 |" in run.stdout
    bad = bench("--tasks", "spam", "--out", str(out))
    assert bad.returncode == 2 and "spam not one of" in bad.stderr


def test_a_temperature_by_the_questions_features_is_fitted_and_checked_leave_one_task_out():
    """benchmarks.quality.feature_temperature on made-up tasks whose answers are too sure on two options and not sure
    enough on eight: a temperature by type alone cannot fit both, one that reads the number of options can, on
    the task it never saw; and by type alone it is the temperature the suite's per-type fit finds."""
    import math
    import random

    from benchmarks.quality.feature_temperature import FEATURES, fit, leave_one_task_out, question
    from prefill.calibration import fit_temperature
    from prefill.engine import softmax
    from prefill.evaluation.metrics import ece
    from prefill.scoring import DEFAULT, Scoring

    rng, rows = random.Random(0), []
    for task in ("a", "b", "c"):
        for k, true_t in ((2, 2.0), (8, 0.5)):
            for _ in range(300):
                scores = [rng.gauss(0, 2) for _ in range(k)]
                prior = [rng.gauss(0, 0.5) for _ in range(k)]  # divided out by the served rule (PMI)
                gold = rng.choices(range(k), weights=softmax([s / true_t for s in scores]))[0]
                readouts = [s + p for s, p in zip(scores, prior)]
                rows.append(
                    {"task": task, "type": "choice", "gold": gold, "readouts": {"whole": readouts},
                     "priors": {str(Scoring("whole", "pmi")): prior}}
                )  # fmt: skip
    served = {t: DEFAULT[t] for t in ("noul", "choice", "score")}
    assert DEFAULT["choice"] == Scoring("whole", "pmi")
    asked = [(*question(r, served), r["gold"]) for r in rows]
    pmi = [[w - p for w, p in zip(r["readouts"]["whole"], r["priors"][str(Scoring("whole", "pmi"))])] for r in rows]
    assert all(abs(a - b) < 1e-9 for (s, _, _), m in zip(asked, pmi) for a, b in zip(s, m))
    assert asked[0][1][:4] == [0.0, 1.0, 0.0, math.log(2)] and 0 <= asked[0][1][4] <= 1
    w = fit(asked, ("choice",))
    assert all(x == 0 for f, x in zip(FEATURES, w) if f != "choice")
    plain = fit_temperature([(softmax(s), g) for s, _, g in asked])
    assert abs(math.exp(w[1]) - plain) < 0.01 * plain
    ways = leave_one_task_out(rows, served)
    assert all(abs(sum(p) - 1) < 1e-9 for v in ways.values() for p in v)
    held = [(p, r["gold"]) for p, r in zip(ways["type + options"], rows)]
    by_type = [(p, r["gold"]) for p, r in zip(ways["per type"], rows)]
    raw = [(softmax(s), g) for s, _, g in asked]
    assert ece(held) < 0.03 and ece(by_type) > 0.06 and ece(raw) > 0.06


def test_a_newcomer_run_asks_every_case_and_counts_what_a_reader_would_say(tmp_path, tokenizer):
    """benchmarks.quality.newcomer as docs/measurements/ runs it (a tiny random model: its answers mean nothing, the
    table's shape and its counts must still add up)."""
    from benchmarks.quality.newcomer import ASKED, CASES

    model = saved_tiny(tmp_path, tokenizer)
    run = lab("quality.newcomer", "--model", str(model), "--dtype", "float32")
    assert run.returncode == 0, run.stderr[-3000:]
    asked = sum(len(expected) for _, expected in CASES)
    rows = [line for line in run.stdout.splitlines() if line.endswith(("| yes |", "| **no** |"))]
    assert len(rows) == asked
    right = sum(line.endswith("| yes |") for line in rows)
    assert f"| all | {right} of {asked} |" in run.stdout
    assert f"{len(CASES)} requests, median" in run.stdout
    assert {q for _, expected in CASES for q in expected} == set(ASKED)


def test_a_first_request_run_times_fresh_processes_with_and_without_warm_up(tmp_path, tokenizer):
    """benchmarks.speed.first_request as docs/measurements/ runs it, on a tiny random model: one fresh process of each
    kind, each timing three requests whose questions were not asked before in it."""
    from benchmarks.speed.first_request import REQUESTS, first_asks

    chosen = first_asks()
    assert len(chosen) == REQUESTS
    ids = [q for _, questions in chosen for q in questions]
    assert len(ids) == len(set(ids))  # no question asked twice: each request pays its own priors
    model = saved_tiny(tmp_path, tokenizer)
    cmd = [sys.executable, "-m", "benchmarks.speed.first_request", "--model", str(model), "--dtype", "float32"]
    run = subprocess.run(cmd + ["--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in run.stdout.splitlines() if line.startswith("| with")}
    assert set(rows) == {"without warm-up", "with warm-up"}
    assert rows["without warm-up"].split("|")[3].strip() == "-"
    assert rows["with warm-up"].split("|")[3].strip().endswith(" s")
    assert "medians over 1 fresh processes each" in run.stdout


def test_the_newcomer_reads_an_answer_as_a_reader_would():
    from types import SimpleNamespace

    from benchmarks.quality.newcomer import answer_of

    assert answer_of(SimpleNamespace(type="noul", noul=0.7), "yes") == ("yes (0.70)", True)
    assert answer_of(SimpleNamespace(type="noul", noul=0.3), "yes")[1] is False
    pick = SimpleNamespace(type="choice", choice="Sales", probabilities={"Sales": 0.6, "Billing": 0.4})
    assert answer_of(pick, "Billing") == ("Sales (0.60)", False)
    level = SimpleNamespace(type="score", score=1.4, probabilities={"0": 0.2, "1": 0.2, "2": 0.6})
    assert answer_of(level, "high") == ("high (1.40 of 0..2)", True) and answer_of(level, "low")[1] is False


def test_generated_families_hold_out_texts_never_trained_on():
    """benchmarks.training.singletask's generated families: every held-out text is absent from the training pool,
    and every question has its gold answer among its declared options (so a head can be scored on it)."""
    from benchmarks.training.singletask import FAMILIES, task_items
    from prefill.evaluation.evaluate import gold_index

    for family in FAMILIES:
        pool, test = task_items(family, pool_size=100)
        assert test and pool and len(pool) <= 100
        assert not {json.dumps(i.state, sort_keys=True) for i in pool} & {
            json.dumps(i.state, sort_keys=True) for i in test
        }
        for item in pool + test:
            for qid, q in item.questions.items():
                gold_index(q, item.gold[qid])  # raises when the gold answer is not declared


def test_the_route_tables_show_every_model_task_and_cell():
    from benchmarks.speed.routes import quality_tables, speed_table

    row = {
        "n": 100,
        "engine": {"accuracy": 0.5, "macro_f1": 0.4, "ece": 0.1},
        "trained": {"accuracy": 0.9, "macro_f1": 0.8, "ece": 0.05},
    }
    results = {"enc": {"tasks": {"spam": [row], "routing": [row]}}, "dec": {"tasks": {"spam": [row]}}}
    text = quality_tables(results)
    assert "| spam | 100 | 0.500 / 0.400 / 0.100 | 0.500 / 0.400 / 0.100 |" in text
    assert "| routing | 100 | 0.900 / 0.800 / 0.050 | - |" in text
    assert "| **mean, families** | | 0.900 / 0.800 / 0.050 | - (0 of 1 tasks) |" in text
    speed = speed_table(
        [
            {"model": "enc", "state_tokens": 512, "questions": 1, "seconds": 0.1, "truncated_questions": 1},
            {"model": "dec", "state_tokens": 512, "questions": 1, "seconds": 0.9, "truncated_questions": 0},
        ]
    )
    assert "| 512 | 1 | 0.10 (cut: 1) | 0.90 |" in speed
