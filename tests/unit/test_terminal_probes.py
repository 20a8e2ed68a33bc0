"""What the machine says reaches the terminal escaped (issue 27, class 5): a GPU's name from NVML (`top`,
`doctor`) and another process's name from /proc (`doctor`'s "who holds GPU memory"): a process names itself
(prctl / /proc/self/comm) as it likes. The CLI runs as a user runs it, on a pty, with NVML's seam faked (a
launcher puts tests/unit/fake_pynvml in pynvml's place, then runs `python -m metralectl`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.unit import ptyterm
from tests.unit.ptyterm import HOSTILE, assert_safe

COLOURS = [pytest.param({"NO_COLOR": "1"}, False, id="no-color"),
           pytest.param({"NO_COLOR": "", "FORCE_COLOR": "1"}, True, id="color")]
COMM = "\x1b]0;P\x07\x9b2J\u202e"  # 13 bytes: what fits in a process name (15)


@pytest.fixture()
def hostile_process() -> Iterator[int]:
    """A process of another program that named itself with control characters."""
    code = f"import sys, time; open('/proc/self/comm', 'w').write({COMM!r}); print('named', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "named"
    yield proc.pid
    proc.kill()
    proc.wait()


def _launcher(pid: int) -> list[str]:
    """`python -c` that fakes NVML (one H200 named HOSTILE, with `pid` holding 2 GiB) and runs the CLI."""
    script = textwrap.dedent(f"""
        import runpy, sys
        from tests.unit import fake_pynvml as fk
        device = fk.FakeDevice(name={HOSTILE!r}, compute_procs=[({pid}, 2 * fk.GiB)])
        sys.modules["pynvml"] = fk.make_fake([device])
        sys.argv[0] = "metralectl"
        runpy.run_module("metralectl", run_name="__main__", alter_sys=True)
    """)
    return [sys.executable, "-c", script]


@pytest.mark.parametrize("env,color", COLOURS)
def test_doctor_escapes_a_process_name_and_a_gpu_name(hostile_process: int, env: dict[str, str], color: bool) -> None:
    ran = ptyterm.run(["doctor"], env, argv0=_launcher(hostile_process), timeout=180)
    assert ran.code in (0, 1), ran.text  # doctor's own verdict; never 70
    assert_safe(ran, color=color, shows=("\\x1b]0;P\\x07\\x9b2J\\u202e",))
    assert f"PID {hostile_process} \\x1b]0;P" in ran.text


@pytest.mark.parametrize("env,color", COLOURS)
def test_top_escapes_the_gpu_name_and_reads_no_markup_in_it(hostile_process: int, env: dict[str, str],
                                                            color: bool) -> None:
    ran = ptyterm.run(["top", "--once", "--interval", "0.2"], env, argv0=_launcher(hostile_process), timeout=180)
    assert ran.code == 0, ran.text
    assert_safe(ran, color=color, shows=("\\x1b]0;PWNED\\x07", "\\u202eevil\\u200bname",
                                         "[link=http://evil.example/]click[/link][/]"))  # shown, not obeyed
