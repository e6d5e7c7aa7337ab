"""Watching a job: its statistics (model.py, kept by tracker.py while it runs), the live
dashboard with its JSON API and Prometheus metrics (dashboard.py, docs.py, metrics.py), the
statistics stored beside the checkpoints (store.py) and the HTML report drawn from them
(report.py)."""
