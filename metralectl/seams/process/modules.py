"""Whether a Python engine's interpreter has its module (`process: {module: ...}`), asked the way the engine will
be started: that interpreter, the environment a host process gets (state.engine_environment: the allow-list, no
PYTHONPATH). Only the module's top package is looked up (importlib.util.find_spec, which runs none of its code):
importing vLLM itself takes seconds."""

from __future__ import annotations

import subprocess

from metralectl.safetext import clean
from metralectl.seams.process.state import engine_environment

_PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"


def missing_module(interpreter: str, module: str, *, timeout: float = 30.0) -> str | None:
    """None when `interpreter` finds the top package of `module`; else why not, in a line."""
    top = module.split(".", 1)[0]
    try:
        out = subprocess.run([interpreter, "-c", _PROBE, top], capture_output=True, text=True, timeout=timeout,
                             env=engine_environment({}), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"asking it for the {top!r} package took over {timeout:g} s"
    except OSError as exc:
        return f"it cannot be run: {clean(exc.strerror or str(exc), 200)}"
    if out.returncode == 3:
        return f"it has no {top!r} package"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        return f"asking it for the {top!r} package failed: {clean(last, 200)}"
    return None
