"""One copy of each weight in memory: the form the layer runs, not also the form it was loaded in.

A bf16 layer runs from oneDNN's reordered copy of its weight (backends/cpu.py `pack_linears`), an int8 layer from
its quantised copy; the plain weight stays beside it, read only with gradients on (a LoRA being trained) or to
make a new copy (a LoRA merged). So serving holds every weight twice: the 1.5B in bf16 held 7.6-8.7 GB resident
for 3.1 GB of weights. `release` drops the plain weights of the layers that have a running copy (never a weight
the input embedding shares, nor the LM head's, whose rows the answers' exact logits read),
and `restore` reads them back from the model's own
files when something needs them (`lora.attach`, `CausalLMBackend.merge_adapter`). Measured:
docs/measurements/serving-under-load.md#memory.
"""

from __future__ import annotations

from pathlib import Path

import torch

RUNNING_COPIES = ("_packed", "_int8")


def release(model) -> int:
    """Drop the plain weight of every layer that runs from a copy of its own; the bytes freed. Only for a model
    whose weights are files on this machine (`restore` reads them from there)."""
    drop = releaser(model)
    return sum(drop(name, module) for name, module in model.named_modules()) if drop else 0


def releaser(model):
    """`drop(name, module)`: release one layer's plain weight once it has a running copy (the bytes freed); None
    where the weights are not files to read back. `cpu.pack_linears` calls it as it packs each layer, so the
    whole model is never held plain and packed at once: the 1.5B's load peaked at 6.7 GB of anonymous memory
    for 3.4 GB of weights that way, and stays near the weights now."""
    if not _files(model):
        return None
    shared = {p.data_ptr() for p in model.get_input_embeddings().parameters()}
    head = model.get_output_embeddings()  # its rows are read for the answers' exact logits (cpu.exact_logits)

    def drop(name: str, module) -> int:
        weight = getattr(module, "weight", None)
        if weight is None or module is head or weight.data_ptr() in shared:
            return 0
        if not any(hasattr(module, c) for c in RUNNING_COPIES):
            return 0
        module._released = (f"{name}.weight", weight.dtype, weight.numel())
        module.register_parameter("weight", None)
        return weight.numel() * weight.element_size()

    return drop


def own_memory(model) -> int:
    """Copy the fp32 parameters left after `release` into the process's own memory; how many. transformers maps
    an fp32 file and keeps fp32 tensors as views of it, so in int8 the embedding, the LM head and the norms
    kept the whole 7 GB file mapped, with the pages of every released weight resident beside them (RSS 6.9 GB,
    5.1 GB of it the file's, for 3 GB of served weights); copied, the mapping goes."""
    count = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype == torch.float32:
                p.data = p.data.clone()
                count += 1
    return count


def released_bytes(model) -> int:
    """The bytes of the plain weights released (read back by `restore` when needed)."""
    return sum(m._released[2] * m._released[1].itemsize for m in model.modules() if getattr(m, "_released", None))


def restore(model) -> int:
    """Read the released weights back from the model's files (in the precision they were loaded in); how many."""
    from safetensors import safe_open

    released = {m._released[0]: m for m in model.modules() if getattr(m, "_released", None)}
    count = len(released)
    if not count:
        return 0
    for path in _files(model):
        with safe_open(str(path), framework="pt") as f:
            for key in set(f.keys()) & set(released):
                module = released.pop(key)
                tensor = f.get_tensor(key).to(module._released[1])
                module.register_parameter("weight", torch.nn.Parameter(tensor, requires_grad=False))
                module._released = None
    if released:
        raise FileNotFoundError(f"weights missing from the model's files: {sorted(released)[:3]}")
    return count


def served_bytes(model) -> int:
    """The model's weights, one copy of each, in the precision they are served in (an int8 layer's weight: a
    byte an element): what a server's resident memory is measured against (`prefill_model_weight_bytes`)."""
    seen, total = set(), 0
    for module in model.modules():
        released = getattr(module, "_released", None)
        if released:
            total += released[2] * (1 if hasattr(module, "_int8") else released[1].itemsize)
        for name, p in module.named_parameters(recurse=False):
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * (1 if name == "weight" and hasattr(module, "_int8") else p.element_size())
    return total


def _files(model) -> list[Path]:
    folder = Path(getattr(model.config, "_name_or_path", "") or "")
    return sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
