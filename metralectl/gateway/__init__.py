"""`metralectl gateway`: one OpenAI-compatible endpoint that routes each request by its `model` to the engine on
this box serving it (docs/gateway.md). http1: the framing; routes: who serves what, scanned off the hot path;
server: the event loop, the per-model queue, the relay; metrics: its Prometheus series."""
