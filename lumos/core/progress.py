"""Progress reports: how long-running work says what it is doing.

A stage takes a `report` and calls it with one line per step; the CLI shows those lines under a
spinner (`lumos.cli.output.progress`), while tests and library callers pass nothing.
"""

from __future__ import annotations

from collections.abc import Callable

Report = Callable[[str], None]
"""Called with one line saying what is being done now."""
