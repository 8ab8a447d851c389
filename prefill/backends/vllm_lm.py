"""vLLM as prefill's model engine (`--backend vllm`): the torch tree engine's answers, on vLLM's paged KV
cache, prefix caching and continuous batching.

vLLM takes no custom attention mask, so the token tree is unrolled into ordinary sequences, sent as token
ids (never re-tokenized text). Which sequences: one per node of the tree that has answer tokens under it,
`state + question prompt + the first k tokens of an answer`, asking for the log-probabilities of the
tokens that follow it in the declared answers (`logprob_token_ids`, read from the sampling step; nothing
is generated past that one step). Each such sequence is exactly what the tree shows that node's last
token (the same tokens at the same positions), so questions cannot see each other and the option order
cannot move a probability, by construction; an answer's log-likelihood is the sum along its path, the
same whole-sequence score as the tree's. The prefix cache shares the state and each question's prompt.

Why not one sequence per answer with `prompt_logprobs`: vLLM then skips reading its prefix cache (every
answer re-reads the whole state), and forcing the cache on leaves the rows of cached positions unwritten
(stale memory; vLLM issue #42019). The last position is the one position vLLM computes whatever its cache
holds (a cache hit stops at least one token short), so reading only it keeps the prefix cache safe to use:
a repeated request is all cache hits and still reads freshly computed rows. That is checked, not assumed:
an output whose cache hit covers its whole sequence is run again under a fresh `cache_salt` (tested in
tests/test_vllm.py with repeated requests and questions that share long prefixes).

Cost: each sequence recomputes its tail past its last full cached block (up to `block_size - 1` tokens, plus
its last token), so the tokens run exceed the tree's, which reads every shared token once; `tokens_run`
counts them (docs/design.md#the-vllm-backend). The nodes run in three waves (states, question prompts, answer
prefixes) because sequences scheduled in the same step cannot hit blocks that step is still computing.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from ..render import Branches, Renderer
from .base import Backend

# KV cache size on a CPU (GiB): vLLM's default takes a fraction of the machine's memory, which with a second
# model loaded (tests, benchmarks) does not fit in 24 GiB. 2 GiB holds ~85k tokens of Qwen2.5-0.5B in fp32.
DEFAULT_CPU_KV_CACHE_GIB = 2
WAVE_SEQUENCES = 1024  # sequences handed to vLLM per call: bounds the token-id lists held at once


# Run as `python -c _REAPER PARENT PID...`: once PARENT is gone, SIGTERM the PIDs, SIGKILL what is left after
# 10 s; once the PIDs are gone by themselves, just exit. Only the standard library, so it costs ~10 MB.
_REAPER = """
import os, signal, sys, time
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
parent, pids = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
while alive(parent) and any(map(alive, pids)):
    time.sleep(1)
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in filter(alive, pids):
        os.kill(pid, sig)
    deadline = time.monotonic() + 10
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
"""


def _children() -> set[int]:
    """This process's child processes now."""
    me = os.getpid()
    out = set()
    for task in Path(f"/proc/{me}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


class VLLMBackend(Backend):
    """Scores answers as whole-sequence log-likelihoods with vLLM's `LLM`, in this process (its engine core
    runs in a child process vLLM starts). Same interface as CausalLMBackend's `score`/`score_many`."""

    answers_by = "vLLM, one prefill pass"
    batches = True

    def __init__(
        self,
        directory: str | Path,
        tokenizer,
        name: str,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        block_size: int | None = None,
        llm_options: dict | None = None,
        **prompt,
    ):
        """`prompt`: the Renderer's options (chat, system, noul_words, score_words, choice_words; render.py)."""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_CPU_KV_CACHE_GIB))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up warnings are about tuning, not us
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
        self.name = name
        self.renderer = Renderer(tokenizer, **prompt)
        options = dict(
            model=str(directory),
            tokenizer=str(directory),
            dtype=dtype,
            enable_prefix_caching=True,
            max_model_len=max_model_len,
            seed=0,
            disable_log_stats=True,
            # CUDA graphs and torch.compile take minutes to build on a CPU and pay off on GPUs only.
            enforce_eager=cpu,
            # 32: the CPU attention kernels want multiples of 32 (16 fails there); a smaller block
            # means shorter recomputed tails (vLLM's CPU default is 128).
            block_size=block_size or (32 if cpu else None),
        )
        self._start({k: v for k, v in {**options, **(llm_options or {})}.items() if v is not None})
        self.max_context = self.llm.llm_engine.model_config.max_model_len
        # One token through the model now: a configuration vLLM's kernels cannot run (a CPU takes no 16-wide
        # attention heads, say) fails at start-up rather than on the first request.
        self.llm.generate([self._prompt([0])], self._params(()), use_tqdm=False)
        self.forward_calls = 0  # calls into vLLM (each a set of sequences it schedules as it likes)
        self.sequences_run = 0  # sequences sent
        self.tokens_run = 0  # tokens vLLM computed for them (prompt tokens not found in its prefix cache)
        self.stale_reruns = 0  # outputs whose cache hit reached the row read, run again (expected: 0)

    def _start(self, options: dict) -> None:
        """vLLM's engine, and a watcher for its engine core: a child process that outlives this one unless
        told to stop (seen: after `prefill serve` ended on SIGTERM, the orphaned core and its worker kept two
        cores half busy). A normal exit stops it (atexit; the server's shutdown calls close()); a killed
        process cannot, so a tiny watcher process stops the core when this process is gone (the core's
        workers follow it)."""
        from vllm import LLM

        before = _children()
        self.llm = LLM(**options)
        atexit.register(self.close)
        watcher = [sys.executable, "-c", _REAPER, str(os.getpid()), *map(str, _children() - before)]
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.Popen(watcher, start_new_session=True, **quiet)

    def close(self) -> None:
        """Stop vLLM's engine core and its workers (idempotent)."""
        self.llm.llm_engine.engine_core.shutdown()

    def score(self, state: Sequence[int], questions: Sequence[Branches]) -> list[list[float]]:
        return self.score_many([(state, questions)])[0]

    def score_many(self, jobs: Sequence[tuple[Sequence[int], Sequence[Branches]]]) -> list[list[list[float]]]:
        """Each answer's log-likelihood given its state and question, for several requests in shared waves."""
        states: dict[tuple[int, ...], int] = {}
        for state, _ in jobs:
            states.setdefault(tuple(state), len(states))
        # A node: (its state, prompt + answer prefix) -> the tokens that follow it in some declared answer.
        nodes: dict[tuple[int, tuple[int, ...]], set[int]] = {}
        for state, questions in jobs:
            s = states[tuple(state)]
            for q in questions:
                for answer in q.answers:
                    for k, token in enumerate(answer):
                        nodes.setdefault((s, tuple(q.prompt) + tuple(answer[:k])), set()).add(token)
        prompts = {(states[tuple(state)], tuple(q.prompt)) for state, questions in jobs for q in questions}
        by_state = list(states)
        self._run([(list(state), ()) for state in by_state if state])  # wave 1: each state once, into the prefix cache
        logprobs: dict[tuple[int, tuple[int, ...]], dict[int, float]] = {}
        for wave in ([n for n in nodes if n in prompts], [n for n in nodes if n not in prompts]):
            for start in range(0, len(wave), WAVE_SEQUENCES):
                part = wave[start : start + WAVE_SEQUENCES]
                got = self._run([(list(by_state[s]) + list(path), tuple(sorted(nodes[s, path]))) for s, path in part])
                logprobs.update(zip(part, got))
        return [
            [
                [
                    sum(logprobs[s, tuple(q.prompt) + tuple(answer[:k])][token] for k, token in enumerate(answer))
                    for answer in q.answers
                ]
                for q in questions
            ]
            for s, questions in ((states[tuple(state)], questions) for state, questions in jobs)
        ]

    def _run(self, sequences: list[tuple[list[int], tuple[int, ...]]]) -> list[dict[int, float]]:
        """For each (token ids, wanted next tokens): the wanted tokens' log-probabilities after the sequence,
        from the logits of its last position (an empty wish list just runs it, to fill the prefix cache)."""
        if not sequences:
            return []
        params = [self._params(wanted) for _, wanted in sequences]
        outputs = self.llm.generate([self._prompt(ids) for ids, _ in sequences], params, use_tqdm=False)
        self.forward_calls += 1
        self.sequences_run += len(sequences)
        out: list[dict[int, float]] = []
        for (ids, wanted), o in zip(sequences, outputs):
            cached = o.num_cached_tokens or 0
            if wanted and cached >= len(ids):  # the row read was not computed: never trust it
                self.stale_reruns += 1
                o = self.llm.generate(
                    [self._prompt(ids, cache_salt=uuid.uuid4().hex)], [params[len(out)]], use_tqdm=False
                )[0]
                cached = o.num_cached_tokens or 0
            self.tokens_run += len(ids) - cached
            row = o.outputs[0].logprobs[0] if wanted else {}
            out.append({t: row[t].logprob for t in wanted})
        return out

    @staticmethod
    def _prompt(ids: list[int], **extra):
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=ids, **extra)

    @staticmethod
    def _params(wanted: tuple[int, ...]):
        """One sampling step (greedy, nothing generated past it) with the wanted tokens' log-probabilities
        from the raw logits of the sequence's last position."""
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=1, temperature=0.0, detokenize=False, logprob_token_ids=list(wanted) if wanted else None
        )
