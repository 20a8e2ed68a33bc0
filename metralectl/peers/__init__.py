"""Peers: other metralectl nodes this box knows by key, the bench admission answer, and the peer protocol.

    address   ADDR parsing: ip[:port], [v6]:port, host.local, dns.name (port omitted -> PEER_PORT)
    store     known peers (fingerprint, key, address, first seen, grants) and pending hellos
    config    bench.yaml: bench enabled, floors for memory and disk, hardware class
    protocol  signed requests (created/expires/nonce) and responses; the seen-nonce store
    admission the checks behind "admitted or refused, and why"
    listener  the peer HTTP listener (separate from the local API)
    client    the requesting side (over seams/httpclient.py, imported lazily)

docs/agent.md describes the protocol and the trust model.
"""

from __future__ import annotations

PEER_PORT = 8899  # metralectl's peer port (the local API is 8897; the engine 8888, its EP worker 8889)
