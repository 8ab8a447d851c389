"""Building a static student (`prefill distill --student static`; what it is and how it answers: prefill/static.py).

1. `table`: a static embedding table from a local encoder, model2vec's recipe: every token of the encoder's
   vocabulary run through it alone (between its start and end marks), the outputs mean-pooled, reduced by PCA to
   `dims` and weighted by SIF (a/(a + p), p the token's Zipf probability by its rank in the vocabulary). Built once
   per encoder and cached (all-MiniLM-L6-v2: 30,522 tokens, about a minute on 2 cores). model2vec's own `distill`
   needs transformers < 5.4 and skeletoken, which prefill's pins exclude; the recipe is a few lines.
2. `fit`: per question, a multinomial logistic regression over the text's meaning and form trained on the
   teacher's distributions (soft cross-entropy, an L2 penalty chosen out of fold among PENALTIES), and its
   temperature fitted on the out-of-fold predictions; then refitted on every training row.
3. `save`: the folder `prefill serve --readout` and `prefill batch --readout` take.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..schema import AnyQuestion, answer_labels
from ..static import CONFIG, FORMAT, TOKENIZER, WEIGHTS, signature
from ..static_features import read

DIMS = 256
SIF = 1e-4
PENALTIES = (1e-4, 1e-3, 1e-2)
FOLDS = 5
DEFAULT_ENCODER = "all-minilm-l6-v2"


def table(encoder: str, dims: int = DIMS) -> tuple[np.ndarray, Path]:
    """The static table for a local encoder (a name prefill knows or a folder) and its tokenizer.json: read from
    the cache, else built (it says so and how far it is)."""
    from ..loading import cache_dir, model_directory, resolve

    folder = Path(model_directory(resolve(encoder, "float32")))
    tokenizer_file = folder / TOKENIZER
    if not tokenizer_file.is_file():
        raise ValueError(f"{encoder}: a static table needs the encoder's {TOKENIZER} (a fast tokenizer)")
    cached = cache_dir() / "static" / f"{folder.name}-{_digest(folder)}-{dims}.npy"
    if cached.is_file():
        return np.load(cached), tokenizer_file
    built = build_table(folder, dims)
    cached.parent.mkdir(parents=True, exist_ok=True)
    np.save(cached, built)
    return built, tokenizer_file


def build_table(folder: Path, dims: int = DIMS, batch: int = 512) -> np.ndarray:
    from tqdm import tqdm
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    vocabulary = len(tokenizer)
    marks = [t for t in (tokenizer.cls_token_id, tokenizer.bos_token_id) if t is not None][:1]
    ends = [t for t in (tokenizer.sep_token_id, tokenizer.eos_token_id) if t is not None][:1]
    rows = []
    with torch.inference_mode():
        for start in tqdm(range(0, vocabulary, batch), desc=f"static table from {folder.name}", file=sys.stderr):
            ids = torch.arange(start, min(start + batch, vocabulary))[:, None]
            first, last = (torch.tensor(t, dtype=torch.long).expand(len(ids), -1) for t in (marks, ends))
            seq = torch.cat([first, ids, last], 1)
            rows.append(model(input_ids=seq, attention_mask=torch.ones_like(seq)).last_hidden_state.mean(1))
    vectors = torch.cat(rows).double()
    vectors -= vectors.mean(0)
    _, _, components = torch.linalg.svd(vectors, full_matrices=False)
    reduced = vectors @ components[: min(dims, components.shape[0])].T
    rank = torch.arange(2, vocabulary + 2, dtype=torch.float64)
    zipf = (1 / rank) / (1 / rank).sum()
    reduced *= (SIF / (SIF + zipf))[:, None]
    return reduced.float().numpy().astype(np.float16)


def _digest(folder: Path) -> str:
    import zlib

    weights = sorted(folder.glob("*.safetensors"))
    return f"{zlib.crc32(b''.join(str(w.stat().st_size).encode() for w in weights)):08x}"


# ---------------------------------------------------------------- the heads


def features(student_table: np.ndarray, tokenizer_file: Path, states: Sequence[Any]) -> np.ndarray:
    """(rows, dims + HASH_BUCKETS) float32: each state's meaning and form, as the served student reads them."""
    from tokenizers import Tokenizer

    from ..render import render_text

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return read(tokenizer, student_table.astype(np.float32), [render_text(s) for s in states]).dense()


def _fit(x: torch.Tensor, targets: torch.Tensor, penalty: float, steps: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression on soft targets: (weights (answers, features), bias (answers,))."""
    w = torch.zeros(targets.shape[1], x.shape[1], dtype=torch.float32, requires_grad=True)
    b = torch.zeros(targets.shape[1], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, history_size=20, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = -(targets * torch.log_softmax(x @ w.T + b, -1)).sum(-1).mean() + penalty * (w * w).sum()
        value.backward()
        return value

    with torch.enable_grad():
        opt.step(loss)
    return w.detach(), b.detach()


def _cross_entropy(targets: torch.Tensor, logits: torch.Tensor) -> float:
    return float(-(targets * torch.log_softmax(logits, -1)).sum(-1).mean())


def fit_question(x: np.ndarray, teacher: np.ndarray, seed: int = 0) -> dict:
    """One question's head: the penalty and temperature from `FOLDS`-fold out-of-fold predictions, then the
    weights refitted on every row. Returns weights, bias, temperature and the out-of-fold agreement."""
    xs, ts = torch.from_numpy(x), torch.from_numpy(teacher.astype(np.float32))
    order = np.random.default_rng(seed).permutation(len(x))
    folds = [order[k::FOLDS] for k in range(min(FOLDS, len(x)))]
    best = None
    for penalty in PENALTIES:
        logits = torch.zeros_like(ts)
        for held in folds:
            train = np.setdiff1d(order, held)
            w, b = _fit(xs[train], ts[train], penalty)
            logits[held] = xs[held] @ w.T + b
        score = _cross_entropy(ts, logits)
        if best is None or score < best[0]:
            best = (score, penalty, logits)
    _, penalty, oof = best
    temperature = min((0.25 * 1.1**k for k in range(40)), key=lambda t: _cross_entropy(ts, oof / t))
    agreement = float((oof.argmax(-1) == ts.argmax(-1)).float().mean())
    w, b = _fit(xs, ts, penalty)
    return {"weights": w.numpy(), "bias": b.numpy(), "temperature": temperature, "penalty": penalty,
            "out_of_fold_agreement": agreement}  # fmt: skip


def fit(
    x: np.ndarray, taught: Sequence[tuple[AnyQuestion, list[int], np.ndarray]], progress: bool = True
) -> list[dict]:
    """A head per question: `taught` holds (question, the rows the teacher answered it on, the teacher's
    distributions on them in the question's declared answer order)."""
    heads = []
    for k, (q, rows, teacher) in enumerate(taught, 1):
        if progress:
            print(f"static student: question {k}/{len(taught)}, {len(rows)} rows", file=sys.stderr, flush=True)
        heads.append({"question": q, **fit_question(x[rows], teacher)})
    return heads


def save(out: Path, name: str, student_table: np.ndarray, tokenizer_file: Path, heads: Sequence[dict], **notes) -> None:
    """The student's folder: static.json (what it knows), static.npz (the table and the heads), tokenizer.json."""
    out.mkdir(parents=True, exist_ok=True)
    arrays = {"table": student_table}
    questions = []
    for i, head in enumerate(heads):
        q: AnyQuestion = head["question"]
        arrays[f"w{i}"], arrays[f"b{i}"] = head["weights"].astype(np.float32), head["bias"].astype(np.float32)
        questions.append(
            {
                "signature": signature(q),
                "type": q.type,
                "instructions": q.instructions,
                "answers": answer_labels(q),
                "temperature": head["temperature"],
                "penalty": head["penalty"],
                "out_of_fold_agreement": head["out_of_fold_agreement"],
            }
        )
    np.savez(out / WEIGHTS, **arrays)
    shutil.copyfile(tokenizer_file, out / TOKENIZER)
    config = {"prefill_static": FORMAT, "name": name, "questions": questions, **notes}
    (out / CONFIG).write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def teacher_rows(
    rows: Sequence[Any], entries: Mapping[int, dict], questions: Mapping[str, AnyQuestion]
) -> list[tuple[AnyQuestion, list[int], np.ndarray]]:
    """Per question: the positions in `rows` (distill.Row) the teacher answered it on, and its distributions."""
    out = []
    for qid, q in questions.items():
        positions, dists = [], []
        for i, row in enumerate(rows):
            probs = ((entries.get(row.index) or {}).get("probs") or {}).get(qid)
            if probs and all(math.isfinite(p) for p in probs):
                positions.append(i)
                dists.append(probs)
        if positions:
            out.append((q, positions, np.asarray(dists, dtype=np.float32)))
    return out


def curve(
    x: np.ndarray,
    taught: Sequence[tuple[AnyQuestion, list[int], np.ndarray]],
    x_held: np.ndarray,
    held: Sequence[tuple[AnyQuestion, list[int], np.ndarray]],
    heads: Sequence[dict],
    fractions: Sequence[float] = (0.25, 0.5, 1.0),
    seed: int = 0,
) -> list[dict]:
    """Would asking the teacher more rows pay? The heads refitted (each question with the penalty chosen on
    all rows) on nested shares of the training rows: the held-out agreement of each."""
    order = np.random.default_rng(seed).permutation(len(x))
    penalty = {signature(h["question"]): h["penalty"] for h in heads}
    held_by = {signature(q): (rows, teacher) for q, rows, teacher in held}
    out = []
    for fraction in fractions:
        kept = set(order[: max(2, round(fraction * len(x)))].tolist())
        agree = total = 0
        for q, rows, teacher in taught:
            mine = [k for k, r in enumerate(rows) if r in kept]
            if len(mine) < 2 or signature(q) not in held_by:
                continue
            hrows, hteacher = held_by[signature(q)]
            w, b = _fit(
                torch.from_numpy(x[[rows[k] for k in mine]]), torch.from_numpy(teacher[mine]), penalty[signature(q)]
            )
            logits = torch.from_numpy(x_held[hrows]) @ w.T + b
            agree += int((logits.argmax(-1) == torch.from_numpy(hteacher).argmax(-1)).sum())
            total += len(hrows)
        out.append({"rows": len(kept), "agreement": agree / total if total else None})
    return out


def set_hand_off(folder: Path, threshold: float | None) -> None:
    """Record the hand-off threshold distill chose in the student's static.json."""
    path = folder / CONFIG
    config = json.loads(path.read_text(encoding="utf-8"))
    config["hand_off_below"] = threshold
    path.write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
