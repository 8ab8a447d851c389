"""The CPU fast paths (prefill/backends/cpu.py): `--dtype auto` picks bf16 only where the CPU has bf16 matrix
units, int8 on an AVX2 CPU without them; packed linears give what plain ones give; the answer tokens' logits
and the normaliser's largest terms are recomputed in fp32; answers keep their isolation guarantees to the
documented bf16 tolerance, and in int8 to fp32's."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
import types

import pytest
import torch

from prefill import precision
from prefill.backends import cpu
from prefill.backends.tree import Tree
from prefill.engine import Engine
from prefill.render import Branches
from prefill.schema import Choice, Noul, Score

from .helpers import RAW, make_backend

# Packed with other questions vs alone, reordered, renamed: the largest |Δp| measured in bf16 was 0.003 on the
# tiny models here (0 for the Llama one), 0.009 (1.5B) and 0.012 (0.5B) on the real models, and 0.023-0.028 for
# batched requests vs one by one (docs/measurements/cpu-precision.md#precision, `python -m benchmarks.speed.fastpath
# --exact MODEL`): bf16 activations round to 8 significant bits, attention over a longer packed sequence sums in
# another order, and oneDNN's bf16 products sum a row in an order that depends on the row count. `--exact` removes both
# (tested).
BF16_TOL = 1e-2
needs_bf16_units = pytest.mark.skipif(not precision.has_bf16_units(), reason="this CPU has no bf16 matrix units")

STATE = "I was charged twice for my March invoice and the refund has not arrived. The app crashes on launch."
QUESTIONS = {
    "refund": Noul("Is the customer asking for money back?"),
    "team": Choice("Which team should handle this ticket?", ["Billing", "Technical", "Sales", "Shipping"]),
    "anger": Score("How angry?", ["calm", "angry", "very angry"]),
    "kind": Choice("Kind?", ["fraud", "fraud review", "not fraud"]),
}


def flat(a) -> list[float]:
    return [a.noul] if a.type == "noul" else list(a.probabilities.values())


def test_auto_picks_bf16_with_bf16_units_and_int8_on_avx2(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flags, want in (
        (set(), "float32"),  # no fbgemm kernels to run int8 on
        ({"avx2", "avx512f"}, "int8"),
        ({"avx2", "amx_bf16"}, "bfloat16"),
        ({"avx512_bf16"}, "bfloat16"),
    ):
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert precision.resolve_dtype("auto") == want
    assert precision.resolve_dtype("float32") == "float32"  # an explicit dtype is kept
    with pytest.raises(ValueError):
        precision.resolve_dtype("int3")


def test_no_bf16_units_packs_nothing(monkeypatch, tiny_model, tokenizer):
    """On a CPU without bf16 units auto is int8 (AVX2), and no layer is packed for bf16 (even a bf16 model)."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("PREFILL_DTYPE")
    assert precision.resolve_dtype(None) == "int8"
    assert make_backend(copy.deepcopy(tiny_model).to(torch.bfloat16), tokenizer).packed_linears == 0


def test_without_bf16_units_serve_names_the_accurate_model(monkeypatch):
    """The fp32 default is the fast model; `prefill serve` says at start-up which one answers better."""
    from prefill import loading

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    note = loading.default_note(None, "float32")
    assert loading.DEFAULT_NAME in note and f"--model {loading.DEFAULT_BF16_NAME}" in note
    assert loading.default_note("default", "bfloat16") is None  # the bf16 default is the accurate one
    assert loading.default_note(loading.DEFAULT_NAME, "float32") is None  # chosen, not defaulted
    assert loading.default_note(None, "int8") is None  # auto here: the 1.5B in int8
    assert loading.default_name("int8") == loading.DEFAULT_BF16_NAME
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    assert loading.default_note(None, "float32") is None  # fp32 asked for on a CPU that has bf16 units


def test_the_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv("PREFILL_DTYPE", "bfloat16")
    assert precision.resolve_dtype(None) == "bfloat16"
    monkeypatch.delenv("PREFILL_DTYPE")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    assert precision.resolve_dtype(None) == "bfloat16"  # unset: auto


def test_cli_takes_auto():
    run = subprocess.run([sys.executable, "-m", "prefill.cli", "ask", "--help"], capture_output=True, text=True)
    assert "auto" in run.stdout and "--dtype" in run.stdout


@needs_bf16_units
def test_packed_linear_equals_plain():
    """Bit for bit without a bias; with one, the bias is added to the bf16 product (one more rounding: fusing
    it into oneDNN's product made answers depend more on the packing, 0.037 vs 0.017 on the default model, ad hoc)."""
    torch.manual_seed(0)
    layer, biased = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16), torch.nn.Linear(64, 96).to(torch.bfloat16)
    x = torch.randn(1, 7, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        plain, plain_biased = layer(x), biased(x)
        assert cpu.pack_linears(layer) == 1 and cpu.pack_linears(biased) == 1
        packed, packed_biased = layer(x), biased(x)
    assert torch.equal(plain, packed)
    assert torch.allclose(plain_biased.float(), packed_biased.float(), rtol=2**-7, atol=2**-7)
    x.requires_grad_(True)
    layer(x).sum().backward()  # with gradients on, the plain path runs (training is never packed)
    assert x.grad is not None


@needs_bf16_units
def test_bf16_isolation_within_tolerance(tiny_model, tokenizer):
    """Packed vs alone, reordered questions, renamed ids and reordered options, in bf16 on the fast path."""
    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    for scoring in (RAW, None):
        engine = Engine(make_backend(model, tokenizer), **({"scoring": scoring} if scoring else {}))
        assert engine.backend.packed_linears > 0 and engine.backend.dtype == torch.bfloat16
        assert_isolated(engine, BF16_TOL)


def assert_isolated(engine: Engine, tol: float) -> dict:
    """Packed vs alone, reordered questions, renamed ids and reordered options agree within `tol`; returns
    the packed answers."""
    together = engine.ask(STATE, QUESTIONS)[0]
    items = list(QUESTIONS.items())[::-1]
    renamed = engine.ask(STATE, {f"id {i}": q for i, (_, q) in enumerate(items)})[0]
    for i, (qid, q) in enumerate(items):
        alone = engine.ask(STATE, {"x": q})[0]["x"]
        for other in (together[qid], renamed[f"id {i}"]):
            assert max(abs(a - b) for a, b in zip(flat(alone), flat(other))) <= tol
    swapped = engine.ask(
        STATE, {"t": Choice(QUESTIONS["team"].instructions, ["Shipping", "Sales", "Technical", "Billing"])}
    )[0]["t"]
    for name, p in together["team"].probabilities.items():
        assert abs(swapped.probabilities[name] - p) <= tol
    return together


def test_exact_logits_correct_the_normaliser_and_the_answer():
    """bf16-rounded logits with a dominant token: reading them as they are is off by ~0.06 nats; recomputing the
    answer token and the largest logits in fp32 gives the fp32 log-probability."""
    torch.manual_seed(0)
    hidden, vocab = 32, 500
    weight = torch.randn(vocab, hidden)
    h = torch.randn(2, hidden)
    h[0] = weight[7] * 0.6  # row 0 strongly predicts token 7 (a logit near 20)
    logits32 = h @ weight.T
    logits16 = logits32.to(torch.bfloat16)
    tree = Tree.build([Branches((1,), ((7, 9),))], 0)  # one answer of two tokens: read at two rows
    assert len(tree.read_from) == 2
    want = tree.sum_logprobs(logits32)[0][0]
    exact = lambda rows, tokens: torch.einsum("nh,nkh->nk", h[rows], weight[tokens])  # noqa: E731
    rounded = tree.sum_logprobs(logits16)[0][0]
    fixed = tree.sum_logprobs(logits16, exact)[0][0]
    assert abs(fixed - want) < 1e-4 < abs(rounded - want)


@needs_bf16_units
def test_exact_logits_are_used_in_bf16(tiny_model, tokenizer, monkeypatch):
    backend = make_backend(copy.deepcopy(tiny_model).to(torch.bfloat16), tokenizer)
    seen = []
    original = Tree.sum_logprobs
    monkeypatch.setattr(
        Tree,
        "sum_logprobs",
        lambda self, logits, exact=None, **kw: seen.append(exact) or original(self, logits, exact, **kw),
    )
    Engine(backend, scoring=RAW).ask(STATE, QUESTIONS)
    assert seen and all(e is not None for e in seen)
    seen.clear()
    Engine(make_backend(tiny_model, tokenizer), scoring=RAW).ask(STATE, QUESTIONS)  # fp32: read as they are
    assert seen and all(e is None for e in seen)


@needs_bf16_units
def test_the_encoder_route_takes_the_fast_path_too():
    """A tiny BERT in bf16 on the encoder route: its linears are packed and its answers stay isolated (the
    slot scores are read in fp32 from the bf16 hidden states)."""
    from transformers import AutoTokenizer

    from prefill.backends.encoder import EncoderBackend
    from prefill.loading import resolve
    from prefill.scoring import Scoring

    from .helpers import tiny_bert

    tok = AutoTokenizer.from_pretrained(resolve("all-minilm-l6-v2").location)
    bert = tiny_bert(tok)
    whole = dict.fromkeys(("noul", "choice", "score"), Scoring("whole"))
    fp32 = Engine(EncoderBackend(copy.deepcopy(bert).float(), tok, "tiny-bert", batch_size=4), scoring=whole)
    backend = EncoderBackend(bert.to(torch.bfloat16), tok, "tiny-bert", batch_size=4)
    assert backend.packed_linears > 0
    engine = Engine(backend, scoring=whole)
    together = engine.ask(STATE, QUESTIONS)[0]
    reference = fp32.ask(STATE, QUESTIONS)[0]
    for qid, q in QUESTIONS.items():
        alone = engine.ask(STATE, {"x": q})[0]["x"]
        assert max(abs(a - b) for a, b in zip(flat(alone), flat(together[qid]))) <= BF16_TOL
        if together[qid].type != "noul":
            assert abs(sum(flat(together[qid])) - 1) < 1e-6
        assert max(abs(a - b) for a, b in zip(flat(reference[qid]), flat(together[qid]))) <= 0.1


# ---------------------------------------------------------------- int8 (CPUs without bf16 units)


def test_int8_linear_scales_each_row_on_its_own():
    """A row's product does not depend on the other rows of the pass (its own scale, the pinned range): the
    same bits alone, together or reordered, where a scale per pass would flatten the small rows next to a
    large one; close to the fp32 product; with gradients on, the fp32 path runs."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96)
    x = torch.randn(9, 64) * torch.rand(9, 1) * 4
    x[3] *= 50
    with torch.inference_mode():
        want = layer(x)
        assert cpu.quantize_linears(layer) == 1
        together = layer(x)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
        reordered = layer(x.flip(0)).flip(0)
    assert torch.equal(together, alone) and torch.equal(together, reordered)
    assert ((together - want).norm(dim=1) / want.norm(dim=1)).max() < 0.03
    x.requires_grad_(True)
    assert torch.equal(layer(x), want)  # training runs on the fp32 weights


def test_int8_keeps_isolation(tiny_model, tokenizer):
    """Packed vs alone, reordered and renamed questions, reordered options, with int8 as loaded (its attention
    in float64): within 1e-8, since no row's quantisation sees another row and attention gives a question the
    same fp32 bits whatever is packed beside it (the LM head's fp32 rounding is what is left). (How far int8
    moves answers from fp32 is measured on real models, `python -m benchmarks.speed.no_bf16`: a tiny random model's
    near-flat answers say little about it.)"""
    model = copy.deepcopy(tiny_model)
    reference = Engine(make_backend(tiny_model, tokenizer), scoring=RAW).ask(STATE, QUESTIONS)[0]
    assert cpu.quantize_linears(model.get_decoder()) > 0 and not hasattr(model.get_output_embeddings(), "_int8")
    assert cpu.exact_attention(model)
    together = assert_isolated(Engine(make_backend(model, tokenizer), scoring=RAW), 1e-8)
    assert all(flat(reference[qid]) != flat(together[qid]) for qid in QUESTIONS)  # the int8 products ran


REQUESTS = [(STATE, QUESTIONS, None), ("Thanks, great service!", QUESTIONS, None), ("Crashes.", QUESTIONS, None)]


def batched_vs_alone(model, tokenizer) -> float:
    """The largest |dp| between requests batched into shared passes (`decide_many`: the server under load) and
    the same requests asked one by one."""
    alone = [Engine(make_backend(model, tokenizer), scoring=RAW).decide(*r) for r in REQUESTS]
    got = Engine(make_backend(model, tokenizer), scoring=RAW).decide_many(REQUESTS)
    return max(
        max(abs(x - y) for x, y in zip(flat(a.answers[q]), flat(g.answers[q])))
        for a, g in zip(alone, got)
        for q in QUESTIONS
    )


def test_int8_batched_requests_get_the_bits_they_get_alone(tiny_model, tokenizer, monkeypatch):
    """Requests batched into shared passes get exactly the answers they get one by one, in int8 as loaded: each
    state runs alone (`states_run_alone`), and the tree pass that reads them attends through the split attention
    (backends/exact.py). With plain attention over the packed tree instead, the answers move (checked below)."""
    model = copy.deepcopy(tiny_model)
    cpu.to_int8(model)
    assert batched_vs_alone(model, tokenizer) == 0.0
    monkeypatch.setattr("prefill.backends.exact.split_attention", lambda model: False)
    monkeypatch.setattr(model.config, "_attn_implementation", "sdpa")
    assert batched_vs_alone(model, tokenizer) > 1e-8


def test_an_exact_model_reads_a_new_state_and_its_questions_in_one_pass(tiny_model, tokenizer):
    """Where answers are exact (here int8), a state not cached runs in one pass with its first chunk of
    questions, and is cached with the bits its own pass gives: the same request again (its state cached, the
    tree pass alone) and the request batched with others (each state in a pass of its own) get the same bits."""
    model = copy.deepcopy(tiny_model)
    cpu.to_int8(model)
    engine = Engine(make_backend(model, tokenizer), scoring=RAW)
    first = engine.ask(STATE, QUESTIONS)[0]
    assert engine.backend.forward_calls == 1 and engine.backend.seconds["state and tree pass"] > 0
    assert engine.ask(STATE, QUESTIONS)[0] == first and engine.backend.forward_calls == 2
    other = Engine(make_backend(model, tokenizer), scoring=RAW)
    batched = other.decide_many([(STATE, QUESTIONS, None), ("Crashes.", QUESTIONS, None)])[0]
    assert batched.answers == first and other.backend.seconds["state and tree pass"] == 0


@needs_bf16_units
def test_bf16_exact_gives_the_same_bits_packed_batched_or_alone(tiny_model, tokenizer):
    """`--exact` in bf16: packed vs alone, reordered questions and options, renamed ids, batched requests vs one
    by one: the same bits. Plain bf16 moves (within BF16_TOL)."""
    plain, exact = (copy.deepcopy(tiny_model).to(torch.bfloat16) for _ in range(2))
    assert batched_vs_alone(plain, tokenizer) > 0
    cpu.make_exact(exact, "bfloat16")
    assert_isolated(Engine(make_backend(exact, tokenizer), scoring=RAW), 0.0)
    assert batched_vs_alone(exact, tokenizer) == 0.0


@needs_bf16_units
def test_products_in_the_probed_calls_give_a_row_the_same_bits_in_any_pass(tmp_path, monkeypatch):
    """Exact bf16's products: a row's output in passes of 23, 100 and 400 rows, bit for bit, in the calls the
    probe found this CPU's kernel consistent on (plain oneDNN products choose their kernel by the row count, and
    with it the order of a row's sums: seen on the Xeon with AMX). The probe's findings are kept per machine."""
    from prefill.backends import rowblocks

    monkeypatch.setenv("PREFILL_CACHE", str(tmp_path))
    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 1024, bias=False).to(torch.bfloat16)
    cpu.pack_linears(layer)
    product = functools.partial(cpu._packed_product, packed=layer._packed)
    with torch.inference_mode():
        (policy,) = rowblocks.policies({(512, 1024): product}, torch.bfloat16, 512).values()
        assert policy.most % policy.step == 0 and policy.least in rowblocks.CANDIDATES
        assert json.loads((tmp_path / "rowblocks.json").read_text())  # kept: the next load reads it
        x = torch.randn(400, 512, dtype=torch.bfloat16)
        short, middle, long = (rowblocks.multiply(x[:n], product, policy) for n in (23, 100, 400))
        assert torch.equal(short, long[:23]) and torch.equal(middle, long[:100])
        assert torch.equal(long[:5], product(torch.cat([x[:5], x.new_zeros(policy.least - 5, 512)]))[:5])


def test_a_row_policy_makes_calls_of_the_sizes_it_allows():
    from prefill.backends.rowblocks import RowPolicy

    policy = RowPolicy(48, 112)
    assert policy.calls(1) == [48] and policy.calls(48) == [48] and policy.calls(49) == [64]
    assert policy.calls(113) == [64, 64] and policy.calls(400) == [112, 96, 96, 96]
    for rows in range(1, 3000, 37):
        sizes = policy.calls(rows)
        assert sum(sizes) >= rows and all(48 <= s <= 112 and s % 16 == 0 for s in sizes)
        assert len(sizes) == -(-max(48, rows) // 112) or sum(sizes) - rows < 16 * len(sizes)
    assert RowPolicy(96, 112).calls(113) == [96, 96]  # never under its least, whatever the split
    free = RowPolicy(48, 112, free_least=2, free_most=40)  # and any size from 2 to 40 unpadded
    assert free.calls(2) == [2] and free.calls(23) == [23] and free.calls(40) == [40]
    assert free.calls(1) == [48] and free.calls(41) == [48] and free.calls(400) == policy.calls(400)


def test_the_free_range_is_the_longest_run_of_sizes_that_agree():
    """A product that gives other bits in calls of 1 row and of 40 to 43 rows (as a GEMV path or another kernel
    would): the sizes run unpadded are the longest run that agrees with calls of the policy's least."""
    from prefill.backends.rowblocks import free_range

    weight = torch.randn(8, 32, dtype=torch.float64)

    def product(x):
        out = x @ weight.T
        return out + 1e-9 if len(x) == 1 or 40 <= len(x) <= 43 else out

    x = torch.randn(107, 32, dtype=torch.float64)
    assert free_range(product, x, 16, 100) == (44, 100)
    assert free_range(product, x, 16, 60) == (2, 39)
    assert free_range(lambda x: product(x) + (len(x) % 2) * 1e-9, x, 16, 100) == (0, 0)  # no run of 16 sizes


@needs_bf16_units
def test_a_policy_kept_without_a_free_range_gets_one_and_is_not_probed_again(tmp_path, monkeypatch):
    from prefill.backends import rowblocks

    monkeypatch.setenv("PREFILL_CACHE", str(tmp_path))
    layer = torch.nn.Linear(256, 512, bias=False).to(torch.bfloat16)
    cpu.pack_linears(layer)
    product = functools.partial(cpu._packed_product, packed=layer._packed)
    kept = {rowblocks._machine(torch.bfloat16, 512) + "-v5": {"256x512": {"least": 32, "most": 512, "step": 16}}}
    (tmp_path / "rowblocks.json").write_text(json.dumps(kept))
    monkeypatch.setattr(rowblocks, "probe", lambda *a, **k: pytest.fail("probed again"))
    with torch.inference_mode():
        (policy,) = rowblocks.policies({(256, 512): product}, torch.bfloat16, 512, free=64).values()
    assert (policy.least, policy.most) == (32, 512) and policy.free_most <= 64
    assert json.loads((tmp_path / "rowblocks.json").read_text())[next(iter(kept))]["256x512"]["free_most"] == (
        policy.free_most
    )


def test_exact_is_refused_where_it_does_not_apply(tmp_path, tokenizer):
    """`--exact` is bf16's on a CPU (int8 is exact always, fp32 the reference: there it changes nothing), on by
    default there; vLLM and the encoder route refuse `--exact on`."""
    from prefill.api import Prefill

    from .helpers import make_model

    make_model("qwen2", len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fp32 = Prefill(str(tmp_path), dtype="float32", exact=True).backend
    assert fp32.model.config._attn_implementation == "sdpa"
    assert fp32.description.endswith("(causal LM, one prefill pass, float32)")  # what /v1/models says
    with pytest.raises(ValueError, match="--exact"):
        Prefill(str(tmp_path), dtype="float32", exact=True, backend="vllm")
    with pytest.raises(ValueError, match="--exact"):
        Prefill(str(tmp_path), dtype="float32", exact=True, route="encoder")
    with pytest.raises(ValueError, match="--exact is for bf16"):
        cpu.make_exact(make_model("qwen2", len(tokenizer)), "float16")
    if precision.has_bf16_units():  # what `--dtype bfloat16` loads: exact by default, plain when asked
        backend = Prefill(str(tmp_path), dtype="bfloat16").backend
        assert cpu.states_run_alone(backend.model) and backend.model._prefill_exact_rows is True
        assert all(hasattr(m, "_rows") for m in backend.model.modules() if hasattr(m, "_packed"))
        assert backend.description.endswith("(causal LM, one prefill pass, bfloat16, exact)")
        plain = Prefill(str(tmp_path), dtype="bfloat16", exact=False).backend
        assert not cpu.states_run_alone(plain.model) and plain.model.config._attn_implementation == "sdpa"
        assert plain.description.endswith("(causal LM, one prefill pass, bfloat16, plain)")


def test_float64_attention_gives_a_question_the_same_bits_packed_or_alone():
    """A question's queries over the state and its own tokens, alone, and with another question's tokens in
    between (masked out, as in a packed tree): in float64, rounded back, the same fp32 bits (plain fp32 SDPA
    differs in the last bits here, which int8's rounding grows through the layers). Training keeps fp32."""
    torch.manual_seed(0)
    heads, dim, n_state, n_other, n_own = 4, 16, 37, 23, 11
    module = types.SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)
    q = torch.randn(1, heads, n_own, dim)
    k, v = torch.randn(2, 1, heads, n_state + n_other + n_own, dim)
    own = list(range(n_state)) + list(range(n_state + n_other, n_state + n_other + n_own))
    causal = torch.ones(n_own, n_own, dtype=torch.bool).tril()
    packed = torch.zeros(n_own, n_state + n_other + n_own, dtype=torch.bool)
    packed[:, :n_state], packed[:, n_state + n_other :] = True, causal
    alone = torch.cat([torch.ones(n_own, n_state, dtype=torch.bool), causal], dim=1)

    def attend(keys, values, visible):
        mask = torch.zeros(1, 1, *visible.shape).masked_fill_(~visible, torch.finfo(torch.float32).min)
        return cpu._float64_sdpa(module, q, keys, values, mask, scaling=dim**-0.5)[0]

    with torch.inference_mode():  # as the backends score
        got = attend(k, v, packed)
        assert got.dtype == torch.float32 and torch.equal(got, attend(k[:, :, own], v[:, :, own], alone))
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = torch.zeros(1, 1, *packed.shape).masked_fill_(~packed, torch.finfo(torch.float32).min)
    plain = sdpa_attention_forward(module, q, k, v, mask, scaling=dim**-0.5)[0]
    assert torch.equal(attend(k, v, packed), plain)  # with gradients on (LoRA training on fp32 weights): fp32


def test_int8_is_loaded_for_the_decoder_only(tmp_path, tokenizer):
    """`--dtype int8`: the model is read in fp32 and its decoder's linears quantised, the head kept; asked for
    on vLLM or the encoder route, refused (measured on torch decoders only; auto keeps fp32 there)."""
    from prefill.api import Prefill
    from prefill.build import load_causal_lm as load
    from prefill.loading import resolve

    from .helpers import make_model

    make_model("qwen2", len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, _ = load(resolve(str(tmp_path)), "int8")
    assert model.dtype == torch.float32 and not hasattr(model.get_output_embeddings(), "_int8")
    assert all(hasattr(m, "_int8") for m in model.get_decoder().modules() if type(m) is torch.nn.Linear)
    assert model.config._attn_implementation in ("prefill-split-sdpa", "prefill-float64-sdpa")  # isolated
    with pytest.raises(ValueError, match="int8"):
        Prefill(str(tmp_path), dtype="int8", backend="vllm")
    with pytest.raises(ValueError, match="int8"):
        Prefill(str(tmp_path), dtype="int8", route="encoder")


def test_precision_says_what_runs_where_auto_int8_falls_back(tmp_path, tokenizer, monkeypatch):
    """Auto's int8 on a CPU without bf16 units: the decoder runs int8, the encoder route fp32, and `Prefill.dtype`
    (what `prefill bench` reports, and the model it pairs a GGUF with) says which."""
    import prefill.build
    from prefill.api import Prefill

    from .helpers import make_model

    make_model("qwen2", len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    monkeypatch.setattr(prefill.build, "resolve_dtype", lambda asked: "int8")  # what auto picks on an AVX2 CPU
    assert Prefill(str(tmp_path), dtype="auto").dtype == "int8"
    assert Prefill(str(tmp_path), dtype="auto", route="encoder").dtype == "float32"


def test_one_copy_of_each_weight_is_kept_and_the_plain_ones_read_back_when_asked(tmp_path, tokenizer):
    """int8 (as bf16) serves from its own copy of each linear weight: the plain fp32 ones are dropped at load
    (backends/weights.py), the answers unchanged; `restore` reads them back from the model's files (a LoRA to
    merge or train needs them); /metrics reports the weights' size, one copy each, as served."""
    from fastapi.testclient import TestClient

    from prefill.api import Prefill
    from prefill.backends import weights
    from prefill.serving.app import create_app

    from .helpers import make_model

    make_model("qwen2", len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    pf = Prefill(str(tmp_path), dtype="int8", calibration=None)
    model = pf.backend.model
    released = [m for m in model.modules() if getattr(m, "_released", None)]
    assert released and all(m.weight is None for m in released) and pf.backend.released_bytes > 0
    before = pf.engine.ask(STATE, QUESTIONS)[0]
    fresh = make_model("qwen2", len(tokenizer))
    plain_bytes = sum(p.numel() * p.element_size() for p in fresh.parameters())
    int8_elements = sum(m._released[2] for m in released)
    assert pf.backend.weight_bytes == plain_bytes - 3 * int8_elements  # int8 linears: a byte an element, one copy
    with TestClient(create_app(pf.engine)) as client:
        assert f"prefill_model_weight_bytes {float(pf.backend.weight_bytes)}" in client.get("/metrics").text
    assert weights.restore(model) == len(released)
    expected = dict(fresh.named_parameters())
    for name, module in model.named_modules():
        if module in released:
            assert torch.equal(module.weight, expected[f"{name}.weight"])
    assert pf.engine.ask(STATE, QUESTIONS)[0] == before  # served from the int8 copies still
