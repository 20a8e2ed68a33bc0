"""Text from outside reaches a terminal only escaped (issue 27, class 5): each command runs as a user runs it,
`python -m metralectl ...` on a real pty, with hostile text planted where an attacker (or an unlucky user)
would plant it, and the bytes the terminal got are checked (tests/unit/ptyterm.py says what is refused).
Each path is run with NO_COLOR (then no ESC at all) and with FORCE_COLOR (then only our SGR colours).
Docker's paths (`ps`, `logs`) are in tests/integration/test_terminal_labels.py; doctor and top in
test_terminal_probes.py."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit import ptyterm
from tests.unit.ptyterm import HOSTILE, assert_safe
from tests.unit.release_fixture import fixture_recipes, write_release

COLOURS = [pytest.param({"NO_COLOR": "1"}, False, id="no-color"),
           pytest.param({"NO_COLOR": "", "FORCE_COLOR": "1"}, True, id="color")]


def _q(text: str) -> str:
    """A YAML double-quoted scalar: JSON's escapes are YAML's, so any character can be planted."""
    return json.dumps(text)


FORGED = "  DEVIATION     serve.max-num-seqs: 2 -> 64 (not what was validated)"


@pytest.fixture()
def forging_recipe(isolated_env: Path) -> str:
    """A user recipe whose prose fields carry what the checker lets prose hold (line breaks, tabs) to forge a line
    of `show`'s own output; every other control character is the checker's to refuse (issue 27, class 8)."""
    (isolated_env / "config" / "recipes").mkdir()
    (isolated_env / "config" / "recipes" / "forged.yaml").write_text(
        "schema: 1\nname: forged\nextends: demo-cpu\n"
        f"description: {_q('described' + chr(10) + FORGED)}\n"
        f"validated:\n  source: {_q('a benchmark' + chr(10) + FORGED + chr(9) + 'tab')}\n")
    return "forged"


@pytest.mark.parametrize("env,color", COLOURS)
def test_show_keeps_a_recipe_s_prose_on_its_own_line(forging_recipe: str, env: dict[str, str], color: bool) -> None:
    ran = ptyterm.run(["show", forging_recipe], env)
    assert ran.code == 0, ran.text
    assert_safe(ran, color=color, shows=("a benchmark\\n  DEVIATION", "\\ttab"))
    lines = ptyterm.SGR.sub("", ran.text).split("\r\n")
    assert not any(line.startswith("  DEVIATION") for line in lines), ran.text  # no line of ours forged
    assert "docker run -d --name metralectl-forged \\" in lines  # the command keeps its own line breaks


@pytest.mark.parametrize("env,color", COLOURS)
def test_a_refused_user_recipe_is_reported_escaped(isolated_env: Path, env: dict[str, str], color: bool) -> None:
    """A problem quotes the file (an unknown key): `list` notes it, `recipes check` prints it, `show` fails on it."""
    (isolated_env / "config" / "recipes").mkdir()
    bad = isolated_env / "config" / "recipes" / "bad.yaml"
    bad.write_text(f"schema: 1\nname: bad\nextends: demo-cpu\n{_q(HOSTILE)}: 1\n")
    for args, code in ((["list"], 65), (["recipes", "check", str(bad)], 65), (["show", "bad"], None)):
        ran = ptyterm.run(args, env)
        assert code is None or ran.code == code, ran.text
        assert_safe(ran, color=color, shows=("\\x1b]0;PWNED",))


def _hostile_release(dest: Path) -> Path:
    """A release whose index.json says a hostile engine version, one of whose recipes has a hostile id (and
    does not convert, so the sync reports it by that id)."""
    recipes = dict(fixture_recipes())
    recipes[f"qwen3.5/{HOSTILE}"] = b"schema: 2\n"
    return write_release(dest, recipes, index_extra={"engine_version": "1.0 " + HOSTILE, "release": "b40"})


@pytest.mark.parametrize("env,color", COLOURS)
def test_recipes_sync_escapes_what_the_release_says(tmp_path: Path, env: dict[str, str], color: bool) -> None:
    release = _hostile_release(tmp_path / "b40")
    ran = ptyterm.run(["recipes", "sync", "--from", str(release)], env)
    assert ran.code == 65, ran.text  # refused as a whole, or installed without the recipe that did not convert
    assert_safe(ran, color=color, shows=("\\x1b]0;PWNED", "\\u202e"))


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A Hub (HF_ENDPOINT) that refuses every request with 403 and a hostile X-Error-Message, as the Hub says why
    in that header."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"error": "no"}'
        self.send_response(403)
        self.send_header("X-Error-Message", HOSTILE.encode("utf-8").decode("latin-1"))  # raw bytes on the wire
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET
    do_POST = do_GET


@pytest.fixture()
def refusing_hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("env,color", COLOURS)
def test_pull_escapes_the_hubs_error_message(refusing_hub: str, env: dict[str, str], color: bool) -> None:
    ran = ptyterm.run(["pull", "--weights-only", "demo-cpu"], {**env, "HF_ENDPOINT": refusing_hub,
                                                               "HF_HUB_DISABLE_XET": "1"})
    assert ran.code != 0 and ran.code != 70, ran.text
    assert_safe(ran, color=color, live=True, shows=("\\x1b]0;PWNED",))


RENDER = """
import sys, types
from metralectl.cli.staging_cmds import _Renderer
from metralectl.seams.hf.steps import PullEvent
from tests.unit.ptyterm import HOSTILE
repo = "org/model"
with _Renderer() as view:
    view.weights(PullEvent(repo, "note", message="kept " + HOSTILE))
    view.weights(PullEvent(HOSTILE, "download", done=1, total=10, files_done=0, files_total=1))
    view.weights(PullEvent(HOSTILE, "done", done=10, total=10, files_done=1, files_total=1))
    for status in ("Downloading", "Pull complete"):
        view.layer(types.SimpleNamespace(ref="img:1", layer="ab12" + HOSTILE, status=status + HOSTILE, current=1,
                                         total=10))
    view.layer(types.SimpleNamespace(ref="img:1", layer=None, status="Status: " + HOSTILE, current=None, total=None))
print("rendered")
"""


@pytest.mark.parametrize("env,color", COLOURS)
def test_pull_s_progress_escapes_what_the_hub_and_the_daemon_say(env: dict[str, str], color: bool) -> None:
    """The live bars (Rich, markup on in their descriptions) and the lines between them: a note, a file or repo
    name, a layer's id and status; on a terminal, as `pull` draws them."""
    ran = ptyterm.run([], env, argv0=[sys.executable, "-c", RENDER])
    assert ran.code == 0 and "rendered" in ran.text, ran.text
    assert_safe(ran, color=color, live=True, shows=("\\x1b]0;PWNED\\x07", "\\u202eevil"))
