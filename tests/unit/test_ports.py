"""seams/ports: the one bind probe, against real sockets on loopback; `run` and `doctor` both use it."""

from __future__ import annotations

import errno
import inspect
import socket

import pytest

from metralectl.seams.ports import bind_error, port_free
from tests.ports import own_port


def test_a_listener_makes_the_port_taken_and_closing_it_frees_it() -> None:
    port = own_port()  # held beside the listener, so nobody else takes it once the listener is gone
    with socket.create_server(("127.0.0.1", port)):
        error = bind_error("127.0.0.1", port)
        assert error is not None and error.errno == errno.EADDRINUSE
        assert not port_free("127.0.0.1", port)
    assert bind_error("127.0.0.1", port) is None and port_free("127.0.0.1", port)


def test_a_wildcard_listener_takes_the_port_on_loopback_too() -> None:
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        assert not port_free("127.0.0.1", listener.getsockname()[1])


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        listener = socket.socket(socket.AF_INET6)
        listener.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with listener:
        listener.listen()
        assert not port_free("::1", listener.getsockname()[1])


def test_run_and_doctor_share_it() -> None:
    from metralectl.doctor.context import Context
    from metralectl.lifecycle import launch

    assert launch.port_free is port_free
    assert inspect.signature(Context).parameters["port_probe"].default is bind_error
