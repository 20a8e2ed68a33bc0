"""Benchmarks against the served endpoint (docs/bench.md).

Pure core:  stats (percentiles), sse (raw pieces -> token events, counts, spreading), results
            (per-request metrics, window aggregation), params (schemas, `k=v`), suites (stages,
            summaries), gates (verdicts, client budget, exit codes), prompts (exact-length requests)
The seam:   transport (raw asyncio + kernel receive stamps; transport_alt: httpx, aiohttp)
Load:       loadgen (closed/open loop, warm-up/window/drain, client health), shard (processes)
Outside:    target (what is measured; control calls through seams/endpoint), engine_id (which engine: the recipe's or
            the server's signatures), records (run directories),
            energy (telemetry sampler windows), runner (one run end to end; emits events, never prints)
"""
