"""One error hierarchy for the whole program.

The core raises these; seams translate third-party exceptions into them where they are caught;
the CLI boundary turns them into one line + a hint on stderr and an exit code (traceback only
with --debug).
"""

from __future__ import annotations

from dataclasses import dataclass


class MetralError(Exception):
    """An error an operator can act on: what happened, and what to do about it."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str | None = None, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(MetralError):
    """Bad command-line input (unknown recipe, malformed --set, ...)."""

    exit_code = 2


class NotFound(UsageError):
    """A named thing (recipe, image, hardware class) does not exist."""


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

    def __init__(self, problems: list[Problem]) -> None:
        errors = [p for p in problems if p.severity == "error"]
        first = errors[0] if errors else problems[0]
        count = len(errors)
        more = f" (and {count - 1} more)" if count > 1 else ""
        super().__init__(f"{first.location()}: {first.key or 'document'}: {first.message}{more}", first.hint)
        self.problems = problems


class DataError(MetralError):
    """A shipped data directory is broken: a bug in this release, not the operator's fault."""

    exit_code = 3
