"""The table of docs/measurements/cpu-precision.md for the CPU fast path, from `prefill bench --sections fast` runs
(one run per row).

    B=".venv/bin/prefill bench --sections fast --repeats 5"
    $B --dtype float32 --out out/fast-qwen05-fp32
    $B --dtype auto --out out/fast-qwen05-auto
    $B --model qwen2.5-coder-1.5b-instruct --dtype float32 --out out/fast-qwen15-fp32
    $B --model qwen2.5-coder-1.5b-instruct --dtype auto --out out/fast-qwen15-auto
    python -m benchmarks.speed.fastpath out/fast-qwen05-fp32 out/fast-qwen05-auto out/fast-qwen15-fp32 \
        out/fast-qwen15-auto

and the measurements behind the fast path's choices (Qwen2.5-0.5B's shapes, 24 layers, this machine's
threads; about a minute, then about two for the chunk sizes on the default model):

    python -m benchmarks.speed.fastpath --micro
    python -m benchmarks.speed.fastpath --chunks
    python -m benchmarks.speed.fastpath --precision   # bf16 vs fp32 answers, and bf16 isolation, on the default model
    python -m benchmarks.speed.fastpath --exact qwen2.5-coder-1.5b-instruct   # exact vs plain bf16, one run
    python -m benchmarks.speed.fastpath --exact qwen2.5-coder-1.5b-instruct --rounds 8 \
        --timed "exact: split attention, row policy"                       # docs/measurements/cpu-precision.md
    python -m benchmarks.speed.fastpath --profile qwen2.5-coder-1.5b-instruct   # the SemIf request by operator
    python -m benchmarks.speed.fastpath --fused qwen2.5-coder-1.5b-instruct     # its element-wise work compiled
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F


def row(report: dict) -> str:
    s = report.get("fast_path") or report["semif"]
    llama = (
        f"{s['llamacpp_json_s']:.2f} s: **{s['speedup_vs_llamacpp']:.1f}×**"
        if "llamacpp_json_s" in s
        else s.get("llamacpp_skipped", "-")
    )
    first = f" (asked first: {s['new_questions_s']:.2f} s)" if "new_questions_s" in s else ""
    where = s.get("where_time_goes_s", {})
    split = " / ".join(
        f"{where[k]:.2f}" for k in ("state pass", "tree pass", "answer log-probabilities", "rest") if k in where
    )
    return (
        f"| {report['model']} | {s['dtype']} | **{s['prefill_s']:.3f} s**{first} | {s['generate_json_s']:.2f} s: "
        f"{s['speedup_vs_generate']:.1f}× | {llama} | {s['one_question_s']:.3f} s: {s['ratio_to_one_question']:.2f} | "
        f"{s['prefill_tokens_run']} tokens, {s['matrix_gflop']:.0f} GFLOP: {s['achieved_gflops']:.0f} GFLOP/s | "
        f"{s['bare_bf16_linear_gflops']:.0f} / {s['bare_fp32_linear_gflops']:.0f} GFLOP/s: "
        f"**{100 * s['share_of_bf16_linear']:.0f} %** | {split} |"
    )


def ms(fn, repeats: int = 5) -> float:
    """Median milliseconds of `fn` over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1000 * statistics.median(times), 1)


def micro(layers: int = 24, hidden: int = 896, inner: int = 4864, vocab: int = 151936) -> None:
    """The choices of prefill/backends/cpu.py and causal_lm.py, each timed against its alternative."""
    from prefill.backends.cpu import PACK_ROWS_HINT

    mk = torch.ops.mkldnn
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    ws = [torch.randn(inner, hidden, dtype=bf16) * 0.05 for _ in range(layers)]
    packed = [mk._reorder_linear_weight(w, PACK_ROWS_HINT) for w in ws]
    with torch.inference_mode():
        for rows in (3, 388, 771):
            x = torch.randn(1, rows, hidden, dtype=bf16)
            print(
                f"{layers} x Linear({hidden}, {inner}) on {rows} rows, bf16: F.linear "
                f"{ms(lambda: [F.linear(x, w) for w in ws])} ms, oneDNN-packed "
                f"{ms(lambda: [mk._linear_pointwise(x, p, None, 'none', [], '') for p in packed])} ms",
                flush=True,
            )
        x = torch.randn(1, 391, hidden, dtype=bf16)
        g, u, d = ws[0], ws[1], torch.randn(hidden, inner, dtype=bf16)
        gu = torch.cat([g, u])

        def fused():
            a, b = F.linear(x, gu).chunk(2, -1)
            return F.linear(F.silu(a) * b, d)

        print(
            f"MLP on 391 rows: gate and up apart "
            f"{ms(lambda: F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d), 20)} "
            f"ms, one gate+up matrix {ms(fused, 20)} ms",
            flush=True,
        )
        layer_f32 = [torch.nn.Linear(hidden, inner) for _ in range(layers)]
        x32 = torch.randn(1, 388, hidden)
        line = []
        for engine in ("onednn", "x86", "fbgemm"):
            if engine in torch.backends.quantized.supported_engines:
                torch.backends.quantized.engine = engine
                q = [
                    torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(m), {torch.nn.Linear}, dtype=torch.qint8)
                    for m in layer_f32
                ]
                line.append(f"{engine} {ms(lambda: [m(x32) for m in q])} ms")
        xb = x32.to(bf16)
        print(
            f"int8 dynamic quantisation, {layers} layers on 388 rows: {', '.join(line)}; packed bf16 "
            f"{ms(lambda: [mk._linear_pointwise(xb, p, None, 'none', [], '') for p in packed])} ms",
            flush=True,
        )
        print(amx_int8(layer_f32, x32, packed), flush=True)
        head = torch.randn(vocab, hidden, dtype=bf16) * 0.02
        head32 = head.float()
        rows = torch.randn(60, hidden, dtype=bf16)
        print(
            f"LM head, 60 rows: bf16 {ms(lambda: F.linear(rows, head))} ms, fp32 "
            f"{ms(lambda: F.linear(rows.float(), head32))} ms",
            flush=True,
        )
        q = torch.randn(1, 14, 500, 64, dtype=bf16)
        k, v = torch.randn(1, 14, 900, 64, dtype=bf16), torch.randn(1, 14, 900, 64, dtype=bf16)
        allowed = torch.rand(500, 900) > 0.3
        additive = torch.zeros(1, 1, 500, 900, dtype=bf16).masked_fill_(~allowed, torch.finfo(bf16).min)
        print(
            f"SDPA, 500 queries over 900 keys, bf16: additive mask "
            f"{ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=additive), 20)} ms, boolean mask "
            f"{ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[None, None]), 20)} ms",
            flush=True,
        )


def amx_int8(layers: list, x: torch.Tensor, packed: list) -> str:
    """int8 through oneDNN's own int8 product (`onednn.qlinear_pointwise`: AMX int8 where the CPU has it,
    int32 sums, exact whatever the blocking), with prefill's per-token activations (each row divided by its
    largest |value|, on a fixed grid, scaled back after): the product alone, then with quantising the rows
    and scaling the output back, against the packed bf16 layers on the same rows."""
    rows = x.reshape(-1, x.shape[-1])
    weights = []
    for m in layers:
        w = m.weight.detach()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
        q = torch.round(w / scale[:, None]).to(torch.int8)
        weights.append((torch.ops.onednn.qlinear_prepack(q, list(rows.shape)), scale, torch.zeros_like(scale).long()))

    def product(qx, w, out_dtype):
        return torch.ops.onednn.qlinear_pointwise(qx, 1 / 127, 128, *w, None, 1.0, 0, out_dtype, "none", [], "")

    def per_token(w):
        top = rows.abs().amax(dim=1, keepdim=True)
        return product((torch.round(rows / top * 127) + 128).to(torch.uint8), w, torch.float32) * top

    top = rows.abs().amax(dim=1, keepdim=True)
    qx = (torch.round(rows / top * 127) + 128).to(torch.uint8)
    xb = x.to(torch.bfloat16)
    return (
        f"int8 on the matrix units (oneDNN qlinear), {len(layers)} layers on {rows.shape[0]} rows: the product alone "
        f"{ms(lambda: [product(qx, w, torch.bfloat16) for w in weights])} ms, with per-token quantisation and "
        f"scaling back {ms(lambda: [per_token(w) for w in weights])} ms; packed bf16 "
        f"{ms(lambda: [torch.ops.mkldnn._linear_pointwise(xb, p, None, 'none', [], '') for p in packed])} ms"
    )


def chunks(dtypes=("bfloat16", "float32"), sizes=(512, 1024, 2048, 4096)) -> None:
    """CausalLMBackend.chunk_tokens on the default model: the SemIf state with 1 / 21 / 100 questions, fresh
    state, median of 3."""
    from prefill import Prefill
    from prefill.bench.measure import STATE, nouls

    for dtype in dtypes:
        pf = Prefill(dtype=dtype, facts=False)
        for size in sizes:
            pf.backend.chunk_tokens = size
            row = []
            for n in (1, 21, 100):
                qs = nouls(n)
                pf.engine.ask(STATE, qs)  # warm: the priors of these questions are cached

                def fresh():
                    pf.backend.forget_states()
                    pf.engine.ask(STATE, qs)

                row.append(f"{ms(fresh, 3) / 1000:.2f}")
            print(f"{dtype}, chunks of {size} tokens: 1 / 21 / 100 questions {' / '.join(row)} s", flush=True)


PRECISION_STATES = [
    "I was charged twice for order #4471 and the refund never arrived.",
    "The package arrived broken and I want my money back.",
    "Thanks, the support team fixed my login issue in minutes. Great service!",
]


def precision() -> None:
    """The default model's answers in bf16 against fp32 (the SemIf questions, a choice and a score, on the
    SemIf ticket and three short messages): with the LM head's logits read as bf16 gives them, and with the
    answer tokens' and largest logits recomputed in fp32 (the served path); then bf16 isolation on
    prefill/bench/measure.py's ticket (each question alone vs packed, reordered and renamed)."""
    from prefill import Choice, Prefill, Score
    from prefill.backends import causal_lm
    from prefill.bench.measure import STATE, nouls

    qs = {
        **nouls(21),
        "team": Choice(
            "Which team should handle this ticket?", ["Billing", "Technical support", "Sales", "Account management"]
        ),
        "anger": Score("How frustrated is the customer?", ["Calm", "Slightly annoyed", "Frustrated", "Very angry"]),
    }

    def flat(a) -> list[float]:
        return [a.noul, 1 - a.noul] if a.type == "noul" else list(a.probabilities.values())

    def answers(pf) -> list[list[float]]:
        return [flat(a) for state in [STATE, *PRECISION_STATES] for a in pf.ask(state, qs).values()]

    ref = answers(Prefill(dtype="float32", facts=False, calibration=None))
    bf = Prefill(dtype="bfloat16", facts=False, calibration=None)
    served = answers(bf)
    original = causal_lm.CausalLMBackend._exact_logits
    causal_lm.CausalLMBackend._exact_logits = lambda self, head_input: None
    bf.engine.forget_priors()
    rounded = answers(bf)
    causal_lm.CausalLMBackend._exact_logits = original
    for name, got in (("bf16 logits as they are", rounded), ("answer and top-16 logits in fp32 (served)", served)):
        gaps = [max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(ref, got)]
        agree = sum(
            max(range(len(x)), key=x.__getitem__) == max(range(len(y)), key=y.__getitem__) for x, y in zip(ref, got)
        )
        print(
            f"{name}: {len(gaps)} distributions, |dp| vs fp32 mean {statistics.mean(gaps):.4f}, max "
            f"{max(gaps):.3f}, top answer agrees {agree}/{len(gaps)}",
            flush=True,
        )
    from prefill.bench.measure import TICKET
    from prefill.bench.measure import TICKET_QUESTIONS as QUESTIONS

    together = bf.ask(TICKET, QUESTIONS)
    items = list(QUESTIONS.items())[::-1]
    renamed = bf.ask(TICKET, {f"id {i}": q for i, (_, q) in enumerate(items)})
    worst = max(
        max(abs(a - b) for a, b in zip(flat(bf.ask(TICKET, q)), flat(other)))
        for i, (qid, q) in enumerate(items)
        for other in (together[qid], renamed[f"id {i}"])
    )
    print(f"bf16 isolation on the test ticket: largest |dp| alone vs packed / reordered / renamed {worst:.4f}")


def exact(model: str, repeats: int = 3, rounds: int = 2, timed_modes: tuple[str, ...] = ()) -> None:
    """Exact isolation against plain bf16 on one model, in one run: the split attention and the row policy (calls
    of the row counts the kernel is exact on, probed) each alone and together (what `--exact auto` runs in bf16),
    and the earlier --exact (float64 attention, fixed blocks of 128 rows): the largest |dp| of a question packed
    with others vs alone and of batched requests vs one by one, then the SemIf request's seconds (21 questions,
    1), every mode in every round."""
    from benchmarks.speed.no_bf16 import batched_vs_one_by_one, isolation, seconds
    from prefill import Prefill
    from prefill.backends import cpu, exact
    from prefill.backends.rowblocks import RowPolicy
    from prefill.bench.measure import STATE, nouls

    pf = Prefill(model, dtype="bfloat16", exact="on", calibration=None)
    net, config = pf.backend.model, pf.backend.model.config
    layers = [m for m in net.modules() if hasattr(m, "_rows")]
    probed = {id(m): m._rows for m in layers}
    print("row policies:", sorted({(m.in_features, m.out_features, m._rows) for m in layers}), flush=True)
    config._attn_implementation = "sdpa"
    assert cpu.exact_attention(net), "float64 attention (the earlier --exact's) needs SDPA"
    config._attn_implementation = "sdpa"
    assert exact.register(net), "the split attention needs SDPA"
    split, blocks = exact.SPLIT_ATTENTION, RowPolicy(128, 128)
    modes = {  # attention, rows (None: plain products)
        "plain bf16": ("sdpa", None),
        "split attention only": (split, None),
        "row policy only": ("sdpa", "probed"),
        "exact: split attention, row policy": (split, "probed"),
        "split attention, fixed blocks of 128 rows": (split, blocks),
        "float64 attention, fixed blocks of 128 (the earlier --exact)": (cpu.EXACT_ATTENTION, blocks),
    }

    def use(mode: str) -> None:
        config._attn_implementation, rows = modes[mode]
        net._prefill_exact_rows = rows is not None
        for m in layers:
            m._rows = probed[id(m)] if rows == "probed" else rows or probed[id(m)]
        pf.backend.forget_states()
        pf.engine.forget_priors()

    for i, mode in enumerate(modes, 1):
        use(mode)
        gaps = f"packed vs alone {isolation(pf):.2e}, batched vs one by one {batched_vs_one_by_one(pf):.2e}"
        print(f"[{i}/{len(modes)}] {mode}: {gaps}", flush=True)
    timed = [m for m in modes if m in timed_modes] if timed_modes else list(modes)
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        for mode in timed:
            use(mode)
            pf.engine.ask(STATE, nouls(2))  # the priors, once
            for n in (21, 1):
                times.setdefault((mode, n), []).append(seconds(pf, nouls(n), repeats))
                times.setdefault((mode, -n), []).append(cached_seconds(pf, nouls(n), repeats))
            print(
                f"round {r + 1}/{rounds}, {mode}: SemIf 21 questions {times[mode, 21][-1]:.3f} s, "
                f"1 question {times[mode, 1][-1]:.3f} s; the state cached: {times[mode, -21][-1]:.3f} s, "
                f"{times[mode, -1][-1]:.3f} s",
                flush=True,
            )
    print(f"medians of {rounds} rounds, against plain bf16 in the same rounds:")
    for mode in timed:
        cells = []
        for n in (21, 1, -21, -1):
            ratio = statistics.median(t / p for t, p in zip(times[mode, n], times["plain bf16", n]))
            what = f"{abs(n)} question{'s' if abs(n) > 1 else ''}" + (" (state cached)" if n < 0 else "")
            cells.append(f"{what} {statistics.median(times[mode, n]):.3f} s ({ratio:.3f}x)")
        print(f"  {mode}: " + ", ".join(cells), flush=True)


def cached_seconds(pf, questions: dict, repeats: int) -> float:
    """The median seconds of the SemIf request with its state already cached (a later request about it)."""
    from prefill.bench.measure import STATE

    pf.engine.ask(STATE, questions)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        pf.engine.ask(STATE, questions)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def profile(model: str, top: int = 12) -> None:
    """Where the SemIf request's time goes by operator (torch's profiler, the request with a fresh state, its
    priors cached), and the rate its matrix products reach against a bare linear layer timed in the same run:
    what is left to take from the pass once its products run at the machine's rate."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from prefill import Prefill
    from prefill.bench.measure import STATE, nouls
    from prefill.bench.semif import bare_linear_gflops, matrix_flops

    print(f"--profile: loading {model}", file=sys.stderr, flush=True)
    pf = Prefill(model)
    questions = nouls(21)
    print("--profile: the SemIf request 3 times (priors, warm-up), then profiled", file=sys.stderr, flush=True)
    for _ in range(3):  # the priors, then warm
        pf.backend.forget_states()
        pf.engine.ask(STATE, questions)
    pf.backend.forget_states()
    tokens, rows = pf.backend.tokens_run, pf.backend.rows_read
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        pf.engine.ask(STATE, questions)
    tokens, rows = pf.backend.tokens_run - tokens, pf.backend.rows_read - rows
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    print(f"{model}, the SemIf request (21 questions, {tokens} tokens run): {total / 1e6:.3f} s of operators")
    for e in ops[:top]:
        share = 100 * e.self_cpu_time_total / total
        print(f"  {e.key:<55} {e.self_cpu_time_total / 1e6:7.3f} s {share:5.1f} %  x{e.count}")
    products = sum(e.self_cpu_time_total for e in ops if "linear" in e.key or e.key in ("aten::mm", "aten::addmm"))
    gflop = matrix_flops(pf, tokens, rows) / 1e9
    print(
        f"matrix products: {products / 1e6:.3f} s for {gflop:.0f} GFLOP, {gflop / (products / 1e6):.0f} GFLOP/s; "
        f"a bare linear layer in bf16 now: {bare_linear_gflops(pf, torch.bfloat16):.0f} GFLOP/s"
    )


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The decoder's RMSNorm as HF computes it (fp32 inside, the weight applied in the input's dtype), written
    as a function of tensors so that one compiled kernel serves every layer (a module argument would make
    Dynamo compile once per layer, past its recompile limit)."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _add_rmsnorm(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float):
    summed = residual + x
    return summed, _rmsnorm(summed, weight, eps)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def fused_layers(net: torch.nn.Module) -> Callable[[bool], None]:
    """A switch that runs every decoder layer's element-wise work (the norms, the residual add before the
    second norm, SiLU and its multiply, the rotary embedding) as kernels torch.compile fuses, around the same
    products and attention, or as HF's eager code. For Qwen2- and Llama-like layers."""
    compiled = {f.__name__: torch.compile(f, dynamic=True) for f in (_rmsnorm, _add_rmsnorm, _silu_mul)}
    layers = list(net.get_decoder().layers)
    modeling = sys.modules[type(layers[0].self_attn).__module__]
    eager_rope, eager_forward = modeling.apply_rotary_pos_emb, {id(m): m.forward for m in layers}
    fused_rope = torch.compile(eager_rope, dynamic=True)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):  # fmt: skip
        eps = self.input_layernorm.variance_epsilon
        h = compiled["_rmsnorm"](hidden_states, self.input_layernorm.weight, eps)
        h, _ = self.self_attn(
            hidden_states=h,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        residual, h = compiled["_add_rmsnorm"](hidden_states, h, self.post_attention_layernorm.weight, eps)
        mlp = self.mlp
        return residual + mlp.down_proj(compiled["_silu_mul"](mlp.gate_proj(h), mlp.up_proj(h)))

    def use(on: bool) -> None:
        modeling.apply_rotary_pos_emb = fused_rope if on else eager_rope
        for m in layers:
            m.forward = types.MethodType(forward, m) if on else eager_forward[id(m)]

    return use


def fused(model: str, runs: int = 8) -> None:
    """The element-wise work fused by torch.compile against HF's eager code, on one model in one run: the
    compile's cost, the SemIf request's seconds (21 questions and 1, fresh states, alternated `runs` times,
    medians), how far its answers move, and isolation (packed vs alone) with the fused kernels."""
    from benchmarks.speed.no_bf16 import isolation, seconds
    from prefill import Prefill
    from prefill.bench.measure import STATE, nouls

    print(f"--fused: loading {model}", file=sys.stderr, flush=True)
    pf = Prefill(model)
    use = fused_layers(pf.backend.model)
    asked = {n: nouls(n) for n in (21, 1)}

    def answers() -> list[float]:  # the SemIf request's, from a fresh state
        pf.backend.forget_states()
        return [a.noul for a in pf.engine.ask(STATE, asked[21])[0].values()]

    eager = answers()  # the priors, once, and warm
    started = time.perf_counter()
    use(True)
    fused_answers, _ = answers(), seconds(pf, asked[1], 1)
    print(f"{model}: compiling the fused kernels and their first requests took {time.perf_counter() - started:.1f} s")
    times: dict[tuple[bool, int], list[float]] = {(on, n): [] for on in (False, True) for n in asked}
    for run in range(runs):
        print(f"--fused: alternated run {run + 1}/{runs}", file=sys.stderr, flush=True)
        for on in (False, True):
            use(on)
            for n in asked:
                times[on, n].append(seconds(pf, asked[n], 1))
    for on, label in ((False, "eager (served)"), (True, "fused")):
        t21, t1 = (statistics.median(times[on, n]) for n in (21, 1))
        print(f"{label}: SemIf 21 questions {t21:.3f} s, 1 question {t1:.3f} s, 21q/1q {t21 / t1:.2f}")
    moved = max(abs(a - b) for a, b in zip(eager, fused_answers))
    use(True)
    print(f"fused vs eager: largest |dp| on the 21 answers {moved:.2e}; fused, packed vs alone {isolation(pf):.2e}")
    use(False)


def rows_that_differ(net, counts=(*range(1, 65), 96, 128, 129, 200, 256, 388, 512, 768, 1024)) -> tuple[str, list]:
    """The row counts at which the decoder's largest packed projection gives its first rows other bits than
    the same rows in a pass of 2,100 (why `--exact` multiplies in fixed blocks of rows)."""
    from prefill.backends import cpu

    layer = max((m for m in net.get_decoder().modules() if hasattr(m, "_packed")), key=lambda m: m.weight.numel())
    x = torch.randn(2100, layer.in_features, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = cpu._packed_product(x, layer._packed)
        differ = [n for n in counts if not torch.equal(cpu._packed_product(x[:n], layer._packed), full[:n])]
    return f"{layer.in_features} x {layer.out_features}", differ


def table(folders: list[str]) -> None:
    print(
        "| model | dtype | 21 questions, one request | HF generate (JSON): prefill faster by | llama.cpp server "
        "(JSON, same GGUF): prefill faster by | 1 question: 21q/1q | matrix work, achieved | bare linear bf16 / fp32 "
        "(this run): engine's share of bf16 | seconds: state / tree / log-probs / rest |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for folder in folders:
        print(row(json.loads((Path(folder) / "bench.json").read_text())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "folders", nargs="*", help="prefill bench --out folders: print the table of docs/measurements/cpu-precision.md"
    )
    ap.add_argument("--micro", action="store_true", help="time the fast path's choices against their alternatives")
    ap.add_argument("--chunks", action="store_true", help="time tree chunk sizes on the default model")
    ap.add_argument("--precision", action="store_true", help="bf16 vs fp32 answers and bf16 isolation, default model")
    ap.add_argument("--exact", metavar="MODEL", help="exact vs plain bf16 on MODEL: isolation and seconds, one run")
    ap.add_argument("--rounds", type=int, default=2, help="--exact: rounds of timings, modes alternated")
    ap.add_argument("--timed", action="append", help="--exact: time only these modes (repeatable; plain always)")
    ap.add_argument("--profile", metavar="MODEL", help="the SemIf request on MODEL by operator, products' rate")
    ap.add_argument("--fused", metavar="MODEL", help="MODEL's element-wise work fused by torch.compile vs eager")
    args = ap.parse_args()
    if args.micro:
        micro()
    if args.chunks:
        chunks()
    if args.precision:
        precision()
    if args.exact:
        timed = ("plain bf16", *args.timed) if args.timed else ()
        exact(args.exact, rounds=args.rounds, timed_modes=timed)
    if args.profile:
        profile(args.profile)
    if args.fused:
        fused(args.fused)
    if args.folders:
        table(args.folders)
    if not (args.micro or args.chunks or args.precision or args.exact or args.profile or args.fused or args.folders):
        ap.error("give bench folders, --micro, --chunks, --precision, --exact MODEL, --profile MODEL or --fused MODEL")


if __name__ == "__main__":
    main()
