"""Trained heads ("readouts" on the command line: `prefill train`, `prefill serve --readout`): small heads over
the frozen model's hidden states (`head.py`), fitting one (`fitting.py`, with the loss in `objective.py`),
`prefill train` (`training.py`) and its LoRA kind (`lora.py`), and `prefill distill` (`distill.py`), which
trains a head on a teacher's answers. The training-free rules that read the model's own tokens are
`prefill.scoring`, not here."""
