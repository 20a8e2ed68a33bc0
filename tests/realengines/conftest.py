"""Fixtures that run Hugging Face `transformers serve` for real (see transformers_serve.py).

`tfserve`: one server for the whole session on the tiny model (natural EOS, hub layout).
`tfserve_factory(**start_kwargs)`: more servers (another layout, EOS suppressed, extra CLI flags),
all stopped at the end of the session.

They skip with the reason when the interpreter lacks the serving stack — except under CI (CI set),
where scripts/bootstrap.sh installs it, so a missing stack fails instead of passing as "skipped".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.realengines.transformers_serve import EngineUnavailable, TfServe, engine_versions, start


@pytest.fixture(scope="session")
def tfserve_versions() -> dict[str, str]:
    try:
        return engine_versions()
    except EngineUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI: transformers serve cannot run: {exc}")
        pytest.skip(f"transformers serve cannot run: {exc}")


@pytest.fixture(scope="session")
def tfserve_factory(tfserve_versions: dict[str, str],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TfServe]]:
    started: list[TfServe] = []

    def make(**kwargs: Any) -> TfServe:
        srv = start(workdir=tmp_path_factory.mktemp("tfserve"), **kwargs)
        started.append(srv)
        return srv

    try:
        yield make
    finally:
        for srv in started:
            srv.stop()


@pytest.fixture(scope="session")
def tfserve(tfserve_factory: Callable[..., TfServe]) -> TfServe:
    return tfserve_factory()
