"""The Docker client's two transports side by side on the real daemon: the socket reader and docker-py give the
runtime the same answers to `ps`'s reads, and the same errors.

Containers of other tests come and go on this daemon meanwhile, so each pair of calls is compared on
what both saw (the listing's ids are compared only when they agree with a second docker-py listing).
"""

from __future__ import annotations

from typing import Any

import pytest

from metralectl.seams.docker.client import DaemonClient
from metralectl.seams.docker.endpoints import DEFAULT_SOCKET, Endpoint
from metralectl.seams.docker.errors import Refused

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def _error(call: Any) -> tuple[str, str, Any, bool]:
    try:
        call()
    except Refused as exc:
        return type(exc).__name__, str(exc), exc.status, exc.image_missing
    raise AssertionError("no error")


def test_the_socket_reads_as_docker_py(docker_daemon: None) -> None:
    endpoint = Endpoint(f"unix://{DEFAULT_SOCKET}", "default")
    ours = DaemonClient(endpoint, 30)
    theirs = DaemonClient(endpoint, 30, socket_reads=False)
    try:
        assert ours.ping() is True and theirs.ping() is True
        assert ours.version()["ApiVersion"] == theirs.version()["ApiVersion"]
        assert ours.info()["ID"] == theirs.info()["ID"]
        for _ in range(5):
            before = [c["Id"] for c in theirs.containers(all=True)]
            mine = [c["Id"] for c in ours.containers(all=True)]
            if before == [c["Id"] for c in theirs.containers(all=True)]:
                assert mine == before
                break
        else:
            raise AssertionError("the daemon's container list changed under every one of 5 tries")
        images = theirs.images()
        assert images, "the daemon has no image to inspect"
        ref = next((tag for image in images for tag in image.get("RepoTags") or [] if tag != "<none>:<none>"),
                   images[0]["Id"])
        assert ours.inspect_image(ref) == theirs.inspect_image(ref)
        for call in (lambda api: api.inspect_container("metralectl-no-such-container"),
                     lambda api: api.inspect_image("metralectl-test/no-such-image:never")):
            assert _error(lambda: call(ours)) == _error(lambda: call(theirs))
        assert _error(lambda: ours.inspect_container("metralectl-no-such-container"))[2] == 404
        assert _error(lambda: ours.inspect_image("metralectl-test/no-such-image:never"))[3] is True
        assert ours._docker is None  # every read above went over the socket
    finally:
        ours.close()
        theirs.close()
