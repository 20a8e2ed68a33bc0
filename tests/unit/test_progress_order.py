"""Issue 19 item 12: progress bars end where their work ends; nothing is drawn again after the lines that
followed them (`✔ ready` used to be followed by a stale download bar)."""

from __future__ import annotations

import io
import re

import pytest

from metralectl.seams.hf.steps import PullEvent

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_a_finished_pull_leaves_one_line_and_no_bar_after_what_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    import rich.console

    from metralectl.cli import staging_cmds

    screen = io.StringIO()
    real = rich.console.Console
    monkeypatch.setattr(rich.console, "Console",
                        lambda **kw: real(file=screen, force_terminal=True, width=120, **{k: v for k, v in kw.items()
                                                                                             if k != "stderr"}))
    with staging_cmds._Renderer() as view:
        assert view.live
        for done in (10, 50, 100):
            view.weights(PullEvent("org/model", "download", done=done, total=100, files_done=0, files_total=2))
        view.weights(PullEvent("org/model", "verify", done=100, total=100, files_done=2, files_total=2))
        view.weights(PullEvent("org/model", "done", done=100, total=100, files_done=2, files_total=2))
        view.say("✔ ready")
    text = _ANSI.sub("", screen.getvalue())
    final = text.rsplit("\r", 1)[-1] if "\r" in text else text
    tail = text[text.rindex("✔ ready"):]
    assert "downloading" not in tail and "verifying" not in tail, repr(tail)  # no bar drawn after it
    assert "org/model: verified" in text and text.index("org/model: verified") < text.index("✔ ready"), final
