"""Offline work that measures answers against labels: proper scores and ECE (`metrics.py`) and the
`prefill eval` / `prefill calibrate` reports on labelled JSONL (`evaluate.py`). The temperatures the server
applies are `prefill.calibration`; nothing at request time imports this folder."""
