"""The background agent: capability monitor, local API + control-plane page, peer listener.

    security    the local API's gate (Host allow-list, same-origin, bearer token) and the token file
    api         the local API server and the page's routes
    jobs        run/swap/stop as jobs under the lifecycle lock
    ops         what the API reads and does (the real one drives the lifecycle over Docker)
    capability  "can this machine run models", re-checked by itself every few seconds
    service     `metralectl agent`: wiring, state file, signals
    (client)    app/agent_client.py: what the CLI asks of a running agent (a peer's unit cancelled), over
                seams/httpclient's loopback

docs/agent.md describes the security model.
"""
