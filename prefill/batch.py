"""`prefill batch IN --questions Q.json --out OUT`: the same questions for every row of a file.

IN and OUT are JSONL, CSV or Parquet (by extension). A row's state is one field (`--state-field`) or the
whole record. OUT has every input row, in order, with each question's answer and probabilities added as
flat columns (`id`, `id.confidence`, `id.p.<option>`); a row that cannot be answered is reported with its
line number and, with `--on-error skip`, kept in OUT with the reason in `prefill_error` (so nothing is
dropped silently), or, with `--on-error stop`, stops the job there.

Resumable: answers go to a journal (`OUT.partial.jsonl`) a batch at a time, flushed; OUT is written from it
when every row is done. Rerun the same command after an interruption (Ctrl-C, a crash, a reboot) and it
continues after the last batch the journal holds: nothing is answered twice and nothing is lost. The
journal remembers the input and the questions, so a rerun with other ones is refused instead of mixed.

Rows share nothing, so `--batch-size` rows at a time go through Engine.decide_many: shared passes, each
answer equal to the row's answer alone.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engine import Engine
from .schema import Answer, wire_questions

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
ERROR_COLUMN = "prefill_error"


class BatchError(Exception):
    """A job that cannot start or go on (bad arguments, a bad row with --on-error stop)."""


@dataclass
class Summary:
    answered: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    resumed_from: int = 0  # rows the journal already held
    out: Path | None = None


def file_format(path: Path) -> str:
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise BatchError(f"{path}: unknown format; use one of {', '.join(sorted(FORMATS))}") from None


class RowFailed(BatchError):
    """A row could not be answered and --on-error is stop."""


def load_questions(raw: Any) -> dict:
    """The questions as the wire takes them ({id: question}), validated by the same rules."""
    try:
        return wire_questions(raw)
    except ValueError as e:
        raise BatchError(f"--questions: {e}") from e


def read_rows(path: Path) -> Iterator[tuple[int, dict | Exception]]:
    """(line number, record) per row; a row that cannot be read comes as its exception. Line numbers are
    the file's (JSONL, CSV: the header is line 1) or the row's 1-based index (Parquet)."""
    kind = file_format(path)
    if kind == "jsonl":
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    yield n, ValueError(f"not valid JSON: {e}")
                    continue
                yield n, record if isinstance(record, dict) else ValueError("a line must be a JSON object")
    elif kind == "csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            start = 2
            for record in reader:
                yield start, record
                start = reader.line_num + 1
    else:
        import pyarrow.parquet as pq

        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                n += 1
                yield n, record


def count_rows(path: Path) -> int:
    """The rows `read_rows` yields (for the progress bar): a JSONL's non-blank lines, unparsed."""
    kind = file_format(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if kind == "jsonl":
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    return sum(1 for _ in read_rows(path))


def state_of(record: Mapping, state_field: str | None) -> Any:
    if state_field is None:
        return dict(record)
    if state_field not in record:
        raise ValueError(f"no field {state_field!r} (fields: {', '.join(map(str, record))})")
    state = record[state_field]
    if not isinstance(state, (str, dict, list)):
        raise ValueError(f"the state field {state_field!r} is {type(state).__name__}, not text, an object or a list")
    return state


def flatten(answers: Mapping[str, Answer]) -> dict[str, Any]:
    """Answers as flat columns: `id` (noul: P(yes); choice: the chosen name; score: the expected level),
    `id.confidence`, and `id.p.<option or level>`."""
    out: dict[str, Any] = {}
    for qid, a in answers.items():
        if a.type == "noul":
            out[qid] = a.noul
            continue
        out[qid] = a.choice if a.type == "choice" else a.score
        out[f"{qid}.confidence"] = a.confidence
        out.update({f"{qid}.p.{k}": p for k, p in a.probabilities.items()})
    return out


class Journal:
    """OUT.partial.jsonl: a header (the input and the questions), then one line per finished row."""

    def __init__(self, out: Path, source: Path, questions: Mapping):
        self.path = out.with_name(out.name + ".partial.jsonl")
        self.header = {
            "prefill_batch": 1,
            "input": str(source.resolve()),
            "questions": hashlib.sha256(
                json.dumps({k: q.model_dump(mode="json") for k, q in questions.items()}, sort_keys=True).encode()
            ).hexdigest(),
        }

    def done(self) -> dict[int, dict]:
        """The rows already finished, by row index. A torn last line (the job was killed mid-write) is cut."""
        if not self.path.exists():
            return {}
        rows: dict[int, dict] = {}
        good = 0
        with open(self.path, "rb") as f:
            for i, line in enumerate(f):
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    break
                if i == 0:
                    if {k: entry.get(k) for k in self.header} != self.header:
                        raise BatchError(
                            f"{self.path} was written for another input or other questions; delete it to start over"
                        )
                else:
                    rows[entry["row"]] = entry
                good += len(line)
        with open(self.path, "r+b") as f:
            f.truncate(good)
        return rows

    def records(self) -> list[dict]:
        """Every finished row's record, in row order."""
        return [e["record"] for _, e in sorted(self.done().items())]

    def record_lines(self) -> Iterator[str]:
        """Every finished row's record as the JSON text its journal line holds, in row order, never parsed:
        an entry is written row, line, [error,] record, so its record is the text after the first `, "record": `
        (inside a JSON string a quote is always escaped, so that text cannot occur earlier). Writing a JSONL
        OUT this way, rather than by parsing the journal and dumping each record again, made `prefill batch`
        with the static student 1.1x as fast on package descriptions (docs/measurements/static-student.md)."""
        rows = []
        with open(self.path, encoding="utf-8") as f:
            next(f)  # the header
            for line in f:
                head, _, record = line.partition(', "record": ')
                rows.append((int(head[len('{"row": ') : head.index(",")]), record.rstrip("\n")[:-1]))
        rows.sort(key=lambda r: r[0])  # written in row order already; sorted in case
        return (record for _, record in rows)

    def open(self):
        new = not self.path.exists() or self.path.stat().st_size == 0
        f = open(self.path, "a", encoding="utf-8")
        if new:
            f.write(json.dumps(self.header) + "\n")
            f.flush()
        return f


Group = list[tuple[int, int, Any]]  # (row index, line number, record), answered together


def answer_group(engine: Engine, group: Group, questions: Mapping, state_field: str | None) -> list[dict]:
    """A group's journal entries: each row with its answers, or with the reason it could not be answered."""
    entries, asked, requests = [], [], []
    for row, line, record in group:
        try:
            requests.append((state_of(record, state_field), questions, None))
            asked.append((row, line, record))
        except ValueError as e:
            entries.append(_failed(row, line, record, e))
    for (row, line, record), d in zip(asked, engine.decide_many(requests)):
        entries.append(
            _failed(row, line, record, d)
            if isinstance(d, Exception)
            else {"row": row, "line": line, "record": {**record, **flatten(d.answers)}}
        )
    return sorted(entries, key=lambda e: e["row"])


def _failed(row: int, line: int, record: Any, e: Exception) -> dict:
    reason = f"{type(e).__name__}: {e}"
    record = record if isinstance(record, dict) else {}
    return {"row": row, "line": line, "error": reason, "record": {**record, ERROR_COLUMN: reason}}


def groups(source: Path, done: Mapping[int, Any], batch_size: int) -> Iterator[Group]:
    """The rows not done yet, `batch_size` readable rows a group; a row that cannot be read is a group of
    its own (its record is the exception), so it never changes how the others are grouped."""
    pending: Group = []
    for row, (line, record) in enumerate(read_rows(source)):
        if row in done:
            continue
        if isinstance(record, Exception):
            yield [(row, line, record)]
            continue
        pending.append((row, line, record))
        if len(pending) >= batch_size:
            yield pending
            pending = []
    if pending:
        yield pending


def answered_groups(
    engine: Engine, planned: Iterator[Group], questions: Mapping, state_field: str | None
) -> Iterator[tuple[Group, list[dict]]]:
    """Each group with its entries, in order, answered in this process. An engine that answers a row in well
    under a millisecond (`answers_ahead`: the static student) answers the next group in a thread while this
    one is journaled: its tokenizer runs without the GIL, on the other core, beside the journal's JSON."""

    def answer(group: Group) -> list[dict]:
        return unreadable(group) or answer_group(engine, group, questions, state_field)

    if not getattr(engine, "answers_ahead", False):
        for group in planned:
            yield group, answer(group)
        return
    ahead = int(engine.answers_ahead)
    pool = ThreadPoolExecutor(ahead, thread_name_prefix="prefill-batch")
    try:
        waiting: deque = deque()
        for group in planned:
            waiting.append((group, pool.submit(answer, group)))
            if len(waiting) > ahead:
                group, entries = waiting.popleft()
                yield group, entries.result()
        while waiting:
            group, entries = waiting.popleft()
            yield group, entries.result()
    finally:  # stopped (Ctrl-C, --on-error stop): a group not started yet is not answered for nothing
        pool.shutdown(wait=True, cancel_futures=True)


def unreadable(group: Group) -> list[dict] | None:
    """The entry of a row that could not be read (`groups` yields it alone), else None."""
    row, line, record = group[0]
    return [_failed(row, line, None, record)] if isinstance(record, Exception) else None


def run(
    engine: Engine | None,
    source: Path,
    questions: Mapping,
    out: Path,
    *,
    state_field: str | None = None,
    on_error: str = "skip",
    batch_size: int = 16,
    progress: bool = True,
    answer=None,
) -> Summary:
    """Answer `questions` for every row of `source` into `out` (see the module's docstring). `answer`
    replaces answering here: a function of the planned groups yielding (group, entries) in order
    (batch_ray.ray_answers)."""
    from tqdm import tqdm

    file_format(out)
    if on_error not in ("skip", "stop"):
        raise BatchError(f"--on-error is skip or stop, not {on_error!r}")
    journal = Journal(out, source, questions)
    if out.exists() and not journal.path.exists():
        raise BatchError(f"{out} exists and is complete; delete it to answer again")
    done = journal.done()
    summary = Summary(resumed_from=len(done), out=out)
    summary.skipped = [(e["line"], e["error"]) for e in done.values() if "error" in e]
    answer = answer or (lambda planned: answered_groups(engine, planned, questions, state_field))
    bar = tqdm(
        total=count_rows(source),
        initial=len(done),
        unit="row",
        desc=f"prefill batch {source.name}",
        disable=not progress,
        dynamic_ncols=True,
    )
    with journal.open() as log, bar:
        for group, entries in answer(groups(source, done, batch_size)):
            failures = [e for e in entries if "error" in e]
            if failures and on_error == "stop":
                first = failures[0]
                raise RowFailed(
                    f"{source}:{first['line']}: {first['error']} (--on-error skip would record it and go on)"
                )
            for e in failures:
                bar.write(f"{source}:{e['line']}: skipped: {e['error']}")
                summary.skipped.append((e["line"], e["error"]))
            summary.answered += len(entries) - len(failures)
            log.write("".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in entries))
            log.flush()
            os.fsync(log.fileno())
            bar.update(len(group))
    write_out(out, journal)
    journal.path.unlink()
    return summary


def write_out(out: Path, journal: Journal) -> None:
    """OUT in its format, from the journal's records, written aside and renamed into place (a reader never
    sees half a file). A JSONL OUT's lines are the journal's records as written (`Journal.record_lines`)."""
    tmp = out.with_name(out.name + ".tmp")
    kind = file_format(out)
    if kind == "jsonl":
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(record + "\n" for record in journal.record_lines())
        os.replace(tmp, out)
        return
    records = journal.records()
    if kind == "csv":
        columns = list(dict.fromkeys(k for r in records for k in r))
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            for r in records:
                writer.writerow(
                    {k: json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                )
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = list(dict.fromkeys(k for r in records for k in r))
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in records]), tmp)
    os.replace(tmp, out)
