"""Evaluation: task specs, metrics, probes, scoring and per-task leaderboards in MLflow."""
