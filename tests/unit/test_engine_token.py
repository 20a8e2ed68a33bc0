"""metralectl's own engine token (docs/gateway.md, "Engines behind the gateway"): the engine files' `token-file:`,
the launch layer's decision, the render (a container's read-only mount, a host process's path, the label, never
the token itself), the token file (made 0644 in a 0700 directory, never through a symlink, its grammar exact) and
the one helper that builds the headers from an engine's labels."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from metralectl.core import gateway_keys
from metralectl.core.contract import parse_contract
from metralectl.core.labels import ENGINE_AUTH_TOKEN, LABEL_ENGINE_AUTH, LABEL_OWNER, owner
from metralectl.core.overrides import apply_sets
from metralectl.core.render import render
from metralectl.core.yamlsrc import load_file
from metralectl.lifecycle import engine_token
from metralectl.lifecycle.specs import command_text, spec_here
from tests.unit.recipe_helpers import REPO, catalog

LLAMA = "gemma-4-31b-llamacpp"
TOKEN_FILE = "/run/metralectl/engine-token"


def _recipe(*sets: str):  # type: ignore[no-untyped-def]
    cat = catalog()
    return apply_sets(cat, cat.recipes[LLAMA], list(sets))


# -- the engine files ---------------------------------------------------------------------------------------
def test_the_engines_that_take_a_token_file_say_how() -> None:
    engines = catalog().engines
    llama, metrale = engines["llama-cpp"].token_file, engines["metrale"].token_file
    assert llama is not None and llama.flags == (("api-key-file", "{file}"),) and llama.container_path == TOKEN_FILE
    assert metrale is not None and metrale.flags == (("require-auth", True), ("auth-tokens-file", "{file}"))
    assert metrale.words(engines["metrale"].flags, "/t") == ["--require-auth", "--auth-tokens-file", "/t"]
    # their only auth is a key on the command line (`ps`, `docker inspect`): never used
    assert all(engines[name].token_file is None for name in ("vllm", "sglang", "trtllm"))


@pytest.mark.parametrize("section,fragment", [
    ('  flags: {made-up: "{file}"}\n', "token-file.flags.made-up: names 'made-up', which is not a flag"),
    ("  flags: {api-key-file: /x}\n", "exactly one flag must be valued '{file}'"),
    ('  flags: {n-gpu-layers: "{file}"}\n', "--n-gpu-layers takes no path"),
])
def test_a_bad_token_file_section_is_refused(tmp_path: Path, section: str, fragment: str) -> None:
    engine = tmp_path / "engine"
    (engine / "llama-cpp").mkdir(parents=True)
    for entry in (REPO / "engine" / "llama-cpp").iterdir():
        (engine / "llama-cpp" / entry.name).symlink_to(entry)
    text = (REPO / "engine" / "llama-cpp.yaml").read_text()
    text = text.replace('  flags: {api-key-file: "{file}"}', section.rstrip("\n"), 1)
    (engine / "llama-cpp.yaml").write_text(text)
    contract, check = parse_contract(load_file(engine / "llama-cpp.yaml"), engine)
    errors = [p.render() for p in check.problems if p.severity == "error"]
    assert contract is None and any(fragment in e for e in errors), errors


def test_a_relative_container_path_is_refused(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "llama-cpp").symlink_to(REPO / "engine" / "llama-cpp")
    text = (REPO / "engine" / "llama-cpp.yaml").read_text().replace(f"container-path: {TOKEN_FILE}",
                                                                    "container-path: engine-token", 1)
    (engine / "llama-cpp.yaml").write_text(text)
    _, check = parse_contract(load_file(engine / "llama-cpp.yaml"), engine)
    assert any("token-file.container-path: must be an absolute path" in p.render() for p in check.problems)


# -- the launch layer's decision ----------------------------------------------------------------------------
def test_on_only_with_a_gateway_key_an_engine_that_takes_a_file_and_no_auth_of_the_recipes() -> None:
    cat = catalog()
    llama = cat.engines["llama-cpp"]
    assert engine_token.token_path_for(_recipe(), llama) is None  # no keys file
    gateway_keys.add("laptop", ("*",))
    assert engine_token.token_path_for(_recipe(), llama) == str(engine_token.token_path())
    assert engine_token.token_path_for(_recipe("serve.api-key-file=/mine"), llama) is None  # the recipe's own
    vllm = next(r for r in cat.recipes.values() if r.engine == "vllm")
    assert engine_token.token_path_for(vllm, cat.engines["vllm"]) is None  # no file option: never a CLI secret


# -- the render ---------------------------------------------------------------------------------------------
def test_a_container_gets_the_file_mounted_read_only_and_the_flag_pointing_at_it() -> None:
    cat = catalog()
    recipe = _recipe()
    plain = render(recipe, cat.engines["llama-cpp"], cat.image_for(recipe))
    assert "--api-key-file" not in plain.command and LABEL_ENGINE_AUTH not in plain.labels
    spec = render(recipe, cat.engines["llama-cpp"], cat.image_for(recipe), engine_token="/state/engine-auth/token")
    assert spec.command[-2:] == ("--api-key-file", TOKEN_FILE)
    mount = next(m for m in spec.mounts if m.target == TOKEN_FILE)
    assert mount.source == "/state/engine-auth/token" and mount.read_only
    assert spec.labels[LABEL_ENGINE_AUTH] == ENGINE_AUTH_TOKEN
    assert spec.files == ()  # the token is never part of the spec: the launch makes the file


def test_a_host_process_gets_the_host_path() -> None:
    cat = catalog()
    recipe = _recipe("runtime=process")
    spec = render(recipe, cat.engines["llama-cpp"], cat.image_for(recipe), program="/opt/llama/llama-server",
                  engine_token="/state/engine-auth/token")
    assert spec.is_process and spec.command[-2:] == ("--api-key-file", "/state/engine-auth/token")
    assert spec.mounts == () and spec.labels[LABEL_ENGINE_AUTH] == ENGINE_AUTH_TOKEN


def test_run_print_shows_the_flag_never_the_token() -> None:
    gateway_keys.add("laptop", ("*",))
    engine_token.ensure()
    token = engine_token.read()
    text = command_text(spec_here(catalog(), _recipe()))
    assert "--api-key-file" in text and str(engine_token.token_path()) in text and token not in text


# -- the token file -----------------------------------------------------------------------------------------
def test_made_once_0644_in_a_0700_directory_and_read_back() -> None:
    path = engine_token.ensure()
    first = engine_token.read()
    assert engine_token.TOKEN_RE.fullmatch(first)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert engine_token.ensure() == path and engine_token.read() == first  # kept: running engines hold it


def test_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("A" * 43 + "\n")
    path = engine_token.token_path()
    path.parent.mkdir(parents=True)
    path.symlink_to(elsewhere)
    with pytest.raises(engine_token.EngineTokenError, match="symlink|not a regular file|leads out"):
        engine_token.read()
    os.unlink(path)
    path.parent.rmdir()
    path.parent.symlink_to(tmp_path)  # the directory itself a link
    with pytest.raises(engine_token.EngineTokenError):
        engine_token.read()


@pytest.mark.parametrize("text", ["A" * 43 + "\r\nX-Injected: 1\n", "short\n", "A" * 42 + "!\n", ""])
def test_a_token_of_another_grammar_is_refused_with_the_fix(text: str) -> None:
    path = engine_token.token_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(engine_token.EngineTokenError, match="is not metralectl's engine token") as refused:
        engine_token.read()
    assert "remove" in (refused.value.hint or "")


# -- the one helper -----------------------------------------------------------------------------------------
def test_headers_only_for_an_engine_of_ours_that_asks_the_token() -> None:
    engine_token.ensure()
    token = engine_token.read()
    ours = {LABEL_ENGINE_AUTH: ENGINE_AUTH_TOKEN, LABEL_OWNER: owner()}
    assert engine_token.engine_headers(ours) == {"Authorization": f"Bearer {token}"}
    assert engine_token.engine_headers({LABEL_OWNER: owner()}) == {}
    assert engine_token.engine_headers({**ours, LABEL_OWNER: "someone-else"}) == {}  # never sent to another's
    assert engine_token.engine_headers(None) == {}


def test_a_url_that_names_one_of_this_boxs_engines_gets_its_token_and_no_other_url_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`chat --url` and `top --url` at an engine that asks the token got 401: a URL carried no labels. Only the exact
    origin of an engine served here gets them (the token must not go to another host or port)."""
    from metralectl.app import chat
    from metralectl.errors import MetralError
    from metralectl.telemetry.watch import fixed_targets

    asks = {LABEL_ENGINE_AUTH: ENGINE_AUTH_TOKEN, LABEL_OWNER: owner()}
    monkeypatch.setattr(chat, "served_engines", lambda: [("a", "http://127.0.0.1:8080", asks),
                                                         ("b", "http://127.0.0.1:8081", {})])
    assert chat.resolve(None, "http://127.0.0.1:8080/v1/").labels == asks
    assert chat.served_labels("http://127.0.0.1:8081") == {}
    for other in ("http://127.0.0.1:8082", "http://localhost:8080", "https://127.0.0.1:8080", "http://10.0.0.1:8080",
                  "http://127.0.0.1:8080@evil:8080", "http://127.0.0.1:99999"):
        assert chat.served_labels(other) is None, other
    targets, _ = fixed_targets(["http://127.0.0.1:8080/", "http://127.0.0.1:9"], chat.served_labels)()
    assert [t.labels for t in targets] == [asks, {}]

    def no_docker() -> list[tuple[str, str, dict[str, str]]]:
        raise MetralError("Docker is not running")

    monkeypatch.setattr(chat, "served_engines", no_docker)  # what is served cannot be read: no token, no error
    assert chat.resolve(None, "http://127.0.0.1:8080").labels == {}


def test_a_url_on_another_host_never_waits_on_this_boxs_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """served_labels() asked the runtime for every --url, so `chat --url http://other-box:8080` waited out a hung
    Docker daemon's 10 s first. Another host's engine cannot be one of ours: the runtime is asked only for this
    machine's own addresses (loopback, an address an interface holds, its host name), with no resolver asked."""
    import socket

    from metralectl.app import chat
    from metralectl.seams.sync_http import is_this_machine

    asked: list[str] = []

    def served() -> list[tuple[str, str, dict[str, str]]]:
        asked.append("runtime")
        return []

    monkeypatch.setattr(chat, "served_engines", served)
    for other in ("http://10.255.255.1:8080", "http://192.0.2.7:8080", "http://[2001:db8::1]:8080",
                  "http://other-box.example:8080", "http://224.0.0.1:8080"):
        assert chat.served_labels(other) is None, other
    assert asked == []
    for ours in ("http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080", "http://0.0.0.0:8080",
                 f"http://{socket.gethostname()}:8080"):
        assert chat.served_labels(ours) is None, ours  # nothing is served, but the runtime was asked
    assert asked == ["runtime"] * 5
    assert not is_this_machine("") and not is_this_machine(None) and not is_this_machine("127.1")
    from metralectl.seams.local_address import holds_address  # the gateway's state record asks it too

    assert holds_address("0.0.0.0") and holds_address("::1") and not holds_address("localhost")
    assert not holds_address("224.0.0.1")  # a TCP socket binds a multicast address on Linux; no interface holds it
