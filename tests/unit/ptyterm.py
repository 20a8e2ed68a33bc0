"""The CLI on a real terminal: `python -m metralectl ...` with a pty as its stdin, stdout and stderr, and a
check of the bytes it wrote there (issue 27, class 5). A terminal acts on bytes, so the check is on bytes:
- no ESC at all when colour is off; with colour on, only SGR (`ESC[...m`, colour and weight) and, for a
  command that draws live progress (Rich), the cursor and erase-line controls Rich itself uses;
- no other C0 control but line feed, carriage return and tab (BEL ends an OSC title), no C1 (U+0080-U+009F,
  8-bit CSI and OSC among them), no byte that is not UTF-8;
- no bidi control (U+202A-U+202E, U+2066-U+2069), zero-width or direction mark (U+200B-U+200F), line or
  paragraph separator (U+2028, U+2029) or byte-order mark (U+FEFF) left raw.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# What an attacker plants: an OSC title ended by BEL, OSC 52 (clipboard), clear screen + home, an 8-bit CSI,
# an RLO that reverses what follows, a zero-width space, a line separator, and Rich markup.
HOSTILE = ("\x1b]0;PWNED\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[H\x9b31m\u202eevil\u200bname\u2028"
           "[link=http://evil.example/]click[/link][/]")
VISIBLE = ("\\x1b]0;PWNED\\x07", "\\x1b[2J", "\\x9b31m", "\\u202e", "\\u200b", "\\u2028")  # what it shows as
RICH_LIVE = re.compile(r"\x1b\[(?:\?25[lh]|[0-9]*[AK]|2K)")  # Rich's own live-display controls
SGR = re.compile(r"\x1b\[[0-9;]*m")
RAW_UNICODE = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A)) | set(range(0x200B, 0x2010)) | {
    0x2028, 0x2029, 0xFEFF}


@dataclass
class Ran:
    code: int
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def run(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 120.0, columns: int = 400,
        argv0: Sequence[str] | None = None, stdin: bytes = b"") -> Ran:
    """`python -m metralectl ARGS` (or argv0 + ARGS) on a fresh pty; every byte it wrote, and its exit code."""
    command = [*(argv0 or (sys.executable, "-m", "metralectl")), *args]
    full = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": str(columns), "LINES": "50", **env}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal and all three streams
        try:
            os.chdir(REPO)
            os.execvpe(command[0], command, full)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    if stdin:
        os.write(fd, stdin)
    data = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"{command} did not end within {timeout} s; it wrote {bytes(data)!r}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError as exc:
                if exc.errno == errno.EIO:  # the child closed its side: everything is read
                    break
                raise
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    return Ran(os.waitstatus_to_exitcode(status), bytes(data))


def unsafe(data: bytes, *, color: bool = False, live: bool = False) -> list[str]:
    """What in `data` would act on a terminal (empty: nothing), each with the bytes around it."""
    found: list[str] = []
    text = data.decode("utf-8", "surrogateescape")
    i = 0
    while i < len(text):
        ch, code = text[i], ord(text[i])
        where = repr(text[max(0, i - 30): i + 30])
        if ch == "\x1b":
            sgr = SGR.match(text, i)
            own = RICH_LIVE.match(text, i) if live else None
            if color and sgr is not None:
                i = sgr.end()
                continue
            if own is not None:
                i = own.end()
                continue
            found.append(f"ESC at {i}: {where}")
        elif code < 0x20 and ch not in "\n\r\t" or code == 0x7F:
            found.append(f"C0 {code:#04x} at {i}: {where}")
        elif 0x80 <= code <= 0x9F:
            found.append(f"C1 {code:#04x} at {i}: {where}")
        elif 0xDC80 <= code <= 0xDCFF:
            found.append(f"a byte that is not UTF-8 ({code - 0xDC00:#04x}) at {i}: {where}")
        elif code in RAW_UNICODE:
            found.append(f"U+{code:04X} at {i}: {where}")
        i += 1
    return found


def assert_safe(ran: Ran, *, color: bool = False, live: bool = False, shows: Sequence[str] = VISIBLE) -> None:
    """Nothing in what the command wrote acts on the terminal, and the planted text is shown escaped."""
    problems = unsafe(ran.data, color=color, live=live)
    assert not problems, "raw control characters reached the terminal:\n" + "\n".join(problems[:10])
    plain = SGR.sub("", ran.text) if color else ran.text
    missing = [form for form in shows if form not in plain]
    assert not missing, f"the planted text is not shown escaped ({missing}); the terminal got {ran.text!r}"
    assert "Traceback" not in ran.text and "internal error" not in ran.text, ran.text
