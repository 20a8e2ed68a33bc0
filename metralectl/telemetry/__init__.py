"""Telemetry: the GPU sampler, energy accounting, engine /metrics parsing and thermal status.

Nothing here imports pynvml or prometheus_client at import time (metralectl.seams.gpu and
engine_metrics.parse_metrics import them lazily), so front ends can import freely.
"""
