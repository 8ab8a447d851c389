"""`prefill batch --ray`: the groups of `prefill batch` answered by engine actors on Ray Data, locally or on a
cluster, with the journal, the resume and the output of the single-process run (batch.py)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping

from .batch import Group, answer_group, unreadable
from .schema import wire_questions


def ray_answers(make_engine, questions: Mapping, state_field: str | None, *, actors: int, address: str | None = None):
    """`run`'s `answer` on Ray Data: the groups are spread over `actors` engine actors (each one loads the
    model once: `make_engine`, a picklable function), in order, so the journal, the resume and the output are
    those of the single-process run (the groups are the same, so each answer is too). Local Ray, or the
    cluster at `address`. The groups are planned on the driver first (the rows not done yet, in memory)."""
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "ERROR")  # read when ray.data configures its logging: our bar
    import ray  # says how far the job is

    def answer(planned: Iterator[Group]) -> Iterator[tuple[Group, list[dict]]]:
        planned = list(planned)
        readable = [g for g in planned if not unreadable(g)]
        if readable:
            if not ray.is_initialized():
                ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
            context = ray.data.DataContext.get_current()
            context.execution_options.preserve_order = True
            context.enable_progress_bars = False
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // actors)
            gpus = 1 if ray.cluster_resources().get("GPU") else 0  # one engine per GPU (not tried here: no GPU)
            wire = {k: q.model_dump(mode="json") for k, q in questions.items()}
            items = [{"group": json.dumps(g, ensure_ascii=False, default=str)} for g in readable]
            results = (
                ray.data.from_items(items)
                .map_batches(
                    _RayAnswerer,
                    batch_size=1,
                    batch_format="pandas",
                    concurrency=actors,
                    num_cpus=cpus,
                    num_gpus=gpus,
                    fn_constructor_args=(make_engine, wire, state_field, cpus),
                )
                .iter_rows()
                .__iter__()
            )
        for group in planned:
            yield group, unreadable(group) or json.loads(next(results)["entries"])

    return answer


class _RayAnswerer:
    """One engine per actor, answering one group per call."""

    def __init__(self, make_engine, wire: dict, state_field: str | None, threads: int):
        import torch

        torch.set_num_threads(threads)
        self.engine, self.questions, self.state_field = make_engine(), wire_questions(wire), state_field

    def __call__(self, batch):
        batch["entries"] = [
            json.dumps(
                answer_group(self.engine, [tuple(r) for r in json.loads(g)], self.questions, self.state_field),
                ensure_ascii=False,
                default=str,
            )
            for g in batch["group"]
        ]
        return batch[["entries"]]
