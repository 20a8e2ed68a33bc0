"""One error hierarchy and one exit-code table for the whole program.

The core raises these; seams translate third-party exceptions into them where they are caught;
the CLI boundary turns them into one line + a hint on stderr and an exit code (traceback only
with --debug). Every exit status metralectl ends with is an `ExitCode` member; docs/exit-codes.md is
generated from this table (`scripts/exit-codes.py generate`) and the other docs are checked against it
(tests/unit/test_exit_codes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, unique
from collections.abc import Sequence
from typing import Any


@unique
class ExitCode(IntEnum):
    """How metralectl ended. Three bands: 0-3 it ran and this is the outcome (0/1/2 are the book's
    benchmark meaning, kept for every command); 64-78 it could not do its work, numbered as BSD
    sysexits.h does; 130 the shell's 128 + SIGINT."""

    OK = 0
    FAILED = 1
    GATE = 2
    DEGRADED = 3
    USAGE = 64
    DATA = 65
    UNAVAILABLE = 69
    SOFTWARE = 70
    BUSY = 75
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return EXIT_MEANINGS[self][0]

    @property
    def examples(self) -> str:
        return EXIT_MEANINGS[self][1]

    @classmethod
    def of(cls, value: Any) -> ExitCode:
        """An exit code another process sent (the agent's job, a peer's unit): a member of this table,
        or FAILED for anything else (a negative number, a string, a code a newer version added)."""
        if isinstance(value, int) and not isinstance(value, bool) and value in cls._value2member_map_:
            return cls(value)
        return cls.FAILED


# member -> (meaning, when it happens). docs/exit-codes.md is generated from this.
EXIT_MEANINGS: dict[ExitCode, tuple[str, str]] = {
    ExitCode.OK: ("it ran and did what was asked",
                  "served and ready; a benchmark ran, every request succeeded and no gate failed; "
                  "doctor found no problem"),
    ExitCode.FAILED: ("it ran, and the thing asked for failed or was refused",
                      "a launch never became ready; a swap was rolled back (the previous model serves "
                      "again); a benchmark with failed requests, or invalid or client-bound; doctor "
                      "found a problem; a peer refused; a signature did not verify; `agent status`: no agent "
                      "runs; `search` matched no recipe; nothing is served (or not the recipe named) for `logs`, "
                      "`chat`, `bench` or `swap`: Docker answered, and there is nothing to act on until `run` "
                      "serves one; `run` of a recipe while another one (or the same one with other settings) serves and it "
                      "does not fit the memory budget beside it (the refusal gives the numbers)"),
    ExitCode.GATE: ("it ran, and a gate said no",
                    "a benchmark or campaign completed and a gate's verdict is fail "
                    "(`--no-fail-on-verdict` turns this into 0)"),
    ExitCode.DEGRADED: ("it ran, failed, and left nothing serving",
                        "a swap whose rollback failed too: neither model serves; the swap journal stays "
                        "for `metralectl ps --repair`"),
    ExitCode.USAGE: ("bad command line (sysexits EX_USAGE)",
                     "an unknown option or command, a missing argument, a malformed `--set` or one the recipe "
                     "checker refuses (an unknown key, with \"did you mean\"; a value that begins with '-'), an "
                     "unknown recipe or `--param`, a command that needs a terminal run without one"),
    ExitCode.DATA: ("a data file or record is invalid (sysexits EX_DATAERR)",
                    "a user or synced recipe (or one that `extends:` it), a campaign file or bench.yaml "
                    "fails the checker; a shipped recipe, "
                    "engine contract or kernels file is broken (a bug in this release)"),
    ExitCode.UNAVAILABLE: ("a service it needs cannot be reached (sysexits EX_UNAVAILABLE)",
                           "the Docker daemon is not running, not reachable or refuses this user; an "
                           "engine run as a host process has no program here (not on PATH, nor where "
                           "engines.yaml says); the "
                           "agent or a peer does not answer; the Hugging Face Hub (or HF_ENDPOINT) cannot "
                           "be reached by `pull`, or by `run`/`swap` staging weights; nothing answers at "
                           "the engine endpoint `chat` or `bench` were pointed at"),
    ExitCode.SOFTWARE: ("internal error: a bug in metralectl (sysexits EX_SOFTWARE)",
                        "an unexpected exception (run again with `--debug` for the traceback, and "
                        "report it)"),
    ExitCode.BUSY: ("busy: try again later (sysexits EX_TEMPFAIL)",
                    "another launch, swap or stop (or a peer's benchmark unit) holds this machine's "
                    "lifecycle lock; a peer's unit queue is full; an agent already runs for this "
                    "configuration, or the agent's port is held by another program"),
    ExitCode.INTERRUPTED: ("interrupted: Ctrl-C or SIGTERM (128 + SIGINT), after cleaning up",
                           "whatever was half-started was removed; a benchmark keeps its partial "
                           "record as `interrupted`"),
}


class MetralError(Exception):
    """An error an operator can act on: what happened, and what to do about it."""

    exit_code: ExitCode = ExitCode.FAILED  # every subclass says its own

    def __init__(self, message: str, hint: str | None = None, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(MetralError):
    """Bad command-line input (unknown recipe, malformed --set, ...)."""

    exit_code = ExitCode.USAGE


NOTHING_SERVED = "nothing is being served by metralectl"
RUN_ONE = "`metralectl run RECIPE` serves one; `metralectl ps` shows what runs"


class NotServed(MetralError):
    """A command needs a served model and metralectl serves none, or not the one named: the one answer of
    `logs`, `chat`, `bench` and `swap` (`top`, `ps` and `stop` say the same words and end 0: showing that
    nothing serves, or stopping nothing, is what they were asked). Exit 1, not 69: Docker answered, and
    said nothing serves; 69 is for a service that could not be asked (docs/exit-codes.md)."""

    exit_code = ExitCode.FAILED

    def __init__(self, recipe: str | None = None, served: Sequence[str] = (), hint: str | None = None) -> None:
        if recipe is None:
            message = NOTHING_SERVED
        else:
            message = f"{recipe} is not being served (served now: {', '.join(sorted(set(served))) or 'nothing'})"
        default = RUN_ONE if recipe is None else f"`metralectl run {recipe}` serves it; `metralectl ps` shows what runs"
        super().__init__(message, hint or default)
        self.recipe = recipe


class NotFound(UsageError):
    """A named thing (recipe, image, hardware class) does not exist."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class Problem:
    """One finding of the recipe checker, located in its source file."""

    file: str
    line: int  # 1-based; 0 when unknown
    column: int  # 1-based; 0 when unknown
    key: str  # dotted path inside the document, e.g. "serve.max-seq-len"
    message: str
    hint: str | None = None
    severity: str = "error"  # "error" refuses the recipe; "warning" is shown and let through

    def location(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}:{self.column}"
        return self.file

    def render(self) -> str:
        where = f"{self.location()}: " if self.file else ""
        key = f"{self.key}: " if self.key else ""
        text = f"{where}{self.severity}: {key}{self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


class RecipeInvalid(MetralError):
    """A data file (recipe, engine contract, kernel or image description) failed the checker."""

    exit_code = ExitCode.DATA

    def __init__(self, problems: list[Problem], *, exit_code: ExitCode | None = None) -> None:
        errors = [p for p in problems if p.severity == "error"]
        first = errors[0] if errors else problems[0]
        count = len(errors)
        more = f" (and {count - 1} more)" if count > 1 else ""
        super().__init__(f"{first.location()}: {first.key or 'document'}: {first.message}{more}", first.hint,
                         exit_code=exit_code)
        self.problems = problems


class DataError(MetralError):
    """A shipped data directory is broken: a bug in this release, not the operator's fault."""

    exit_code = ExitCode.DATA
