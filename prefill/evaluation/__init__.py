"""Measuring answers against labels: proper scores and ECE (`metrics.py`), temperatures and a yes-bias fitted
and applied (`calibration.py`), and the `prefill eval` / `prefill calibrate` reports on labelled JSONL
(`evaluate.py`)."""
