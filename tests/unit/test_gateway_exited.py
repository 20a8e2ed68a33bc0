"""The routing table's `exited`: an engine whose record is there but whose process is not went away (a crash); while
the lifecycle lock is held the same sight may be a `stop` or an eviction between its stop and its removal, so it
is not said then. tests/integration/test_gateway_crash_llamacpp.py shows it with real engines."""

from __future__ import annotations

from metralectl.gateway.routes import Route, Scanner


def test_an_exited_record_is_gone_with_its_names_unless_the_lifecycle_lock_is_held() -> None:
    scanner = Scanner(runtime_factory=lambda: None)  # type: ignore[arg-type,return-value]
    scanner._aliases.update({"proc-a": "proc-a", "tiny-a": "proc-a", "proc-b": "proc-b"})
    b = Route("proc-b", "http://127.0.0.1:2", "127.0.0.1", 2, ("proc-b",))
    table = scanner._table([b], None, None, {"proc-a"})
    assert table.exited == {"proc-a": "proc-a", "tiny-a": "proc-a"} and table.find("proc-b") is b
    assert scanner._table([b], "stop proc-a (pid 7)", None, {"proc-a"}).exited == {}  # a stop: not a crash
    assert scanner._table([b], None, None, {"proc-b"}).exited == {}  # another record of it still serves
