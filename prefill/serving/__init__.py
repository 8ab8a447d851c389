"""Serving: the HTTP app (app.py), the queue in front of the model (scheduler.py), metrics (telemetry.py)."""
