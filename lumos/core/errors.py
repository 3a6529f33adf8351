"""Errors that map to the exit codes every verb keeps (see DESIGN.md, "Contracts").

0 success; 1 runtime failure; 2 bad usage, config or input; 3 a gate refused.
The CLI prints `str(error)` without a traceback unless `--debug` is given.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_GATE = 3


class LumosError(Exception):
    """A failure the user can act on; the message says what happened and what to do next."""

    exit_code = EXIT_RUNTIME


class UsageError(LumosError):
    """Bad usage, config or input: wrong flag, missing file, malformed table name, bad rows."""

    exit_code = EXIT_USAGE


class GateError(LumosError):
    """A gate refused: an eval threshold or a promotion rule was not met."""

    exit_code = EXIT_GATE


@dataclass(frozen=True)
class Problem:
    """One config problem: the dotted key path and what is wrong with it."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" if self.key else self.message


class ConfigError(UsageError):
    """Every problem found in one config source, reported at once."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = [f"{source}: {count}"] + [f"  - {problem}" for problem in problems]
        super().__init__("\n".join(lines))
