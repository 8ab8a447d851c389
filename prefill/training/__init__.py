"""Offline work that makes a readout: fitting a head over the frozen model's hidden states (`fitting.py`, with
the loss in `objective.py`), `prefill train` (`train.py`) and its LoRA kind (`lora.py`), and `prefill distill`
(`distill.py`), which trains a head on a teacher's answers. A trained head as served (loaded, checked against
its model, applied) is `prefill.heads`; nothing at request time imports this folder."""
