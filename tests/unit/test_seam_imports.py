"""Outside systems are reached through metralectl/seams/ only: no module outside it imports an HTTP client, the
Docker SDK, huggingface_hub or NVML (docs/ARCHITECTURE.md, "seams").

Every import counts, lazy ones inside functions and those under `if TYPE_CHECKING:` included (a type from
such a library in a signature is a dependency on it too). urllib.parse is allowed anywhere: it only splits
and quotes strings (the agent and the peer listener parse their request targets with it), and so are
`http.HTTPStatus` and http.server; urllib.request, urllib.error and http.client are clients and are not. The one exception is the benchmark's transport (bench/transport.py, raw sockets, and its
comparison clients in bench/transport_alt.py, httpx and aiohttp): it is the measuring instrument, whose
timing is the product, so it talks to the engine itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "metralectl"

# Top-level packages that talk to an outside system (the seam that owns each, for the message).
FORBIDDEN = {
    "httpx": "seams/httpclient.py", "httpcore": "seams/httpclient.py", "aiohttp": "seams/httpclient.py",
    "requests": "seams/docker/", "urllib3": "seams/docker/", "docker": "seams/docker/", "paramiko": "seams/docker/",
    "huggingface_hub": "seams/hf/", "pynvml": "seams/gpu.py",
}
# The standard library's HTTP clients (their parents `urllib` and `http` are checked name by name).
FORBIDDEN_STDLIB = {"urllib.request": "seams/httpclient.py", "urllib.error": "seams/httpclient.py",
                    "http.client": "seams/httpclient.py"}
# Paths under the package, relative, that may: one entry, the benchmark's transport (see above).
EXCEPTION = "bench/transport"


def forbidden_imports(source: str, name: str = "<source>") -> list[tuple[int, str, str]]:
    """(line, what is imported, the seam it belongs in) for every forbidden import in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for target in targets:
            top = target.split(".")[0]
            if top in FORBIDDEN:
                found.append((node.lineno, target, FORBIDDEN[top]))
            elif target in ("urllib", "http"):  # `import urllib` reaches urllib.request by attribute
                if isinstance(node, ast.Import):
                    found.append((node.lineno, target, FORBIDDEN_STDLIB[f"{target}.request" if target == "urllib"
                                                                        else "http.client"]))
            elif any(target == bad or target.startswith(bad + ".") for bad in FORBIDDEN_STDLIB):
                bad = next(b for b in FORBIDDEN_STDLIB if target == b or target.startswith(b + "."))
                found.append((node.lineno, target, FORBIDDEN_STDLIB[bad]))
    return sorted(set(found))


def _outside_the_seams() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith("seams/"):
            out[rel] = path
    return out


def test_nothing_outside_the_seams_imports_an_outside_systems_library() -> None:
    found = [f"metralectl/{rel}:{line}: imports {what} (it belongs in {seam})"
             for rel, path in _outside_the_seams().items() if not rel.startswith(EXCEPTION)
             for line, what, seam in forbidden_imports(path.read_text(), rel)]
    assert not found, "outside systems are reached through metralectl/seams/ only:\n" + "\n".join(found)


def test_the_one_exception_is_still_needed() -> None:
    """The benchmark's transport does import a client (else the exception is stale: delete it here and in the
    docs)."""
    used = [rel for rel, path in _outside_the_seams().items() if rel.startswith(EXCEPTION)
            and forbidden_imports(path.read_text(), rel)]
    assert used == ["bench/transport_alt.py"], used


def test_the_check_finds_each_way_of_importing_a_client() -> None:
    source = """
import httpx
import docker.errors
from requests import exceptions
import urllib.request
from urllib import error
import urllib
import http.client
from http import client
from http.client import HTTPConnection
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from huggingface_hub import HfApi
def later():
    import pynvml
    from aiohttp import ClientSession
"""
    found = {what for _, what, _ in forbidden_imports(source)}
    assert found == {"httpx", "docker.errors", "requests", "requests.exceptions", "urllib.request", "urllib.error",
                     "urllib", "http.client", "http.client.HTTPConnection", "huggingface_hub",
                     "huggingface_hub.HfApi", "pynvml", "aiohttp", "aiohttp.ClientSession"}, found


def test_what_stays_allowed() -> None:
    source = """
from urllib.parse import quote, urlsplit
import urllib.parse
from http import HTTPStatus
import http.server
import socket
from metralectl.seams.docker import runtime
from metralectl.seams.docker.client import DaemonClient
from . import docker
"""
    assert forbidden_imports(source) == []
