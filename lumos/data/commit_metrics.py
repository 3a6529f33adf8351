"""What Delta records about a commit it made: the rows it wrote."""

from __future__ import annotations

from typing import Any

from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import Workspace


def rows_written(spark, workspace: Workspace, ref: TableRef) -> int:
    """The rows the commit of version `ref` wrote (its numOutputRows; 0 when it records none).
    `ref` is a version just written: it is looked for among the table's last five commits."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, table_location(workspace, ref)).history(5).collect()
    metrics: dict[str, Any] = next((row["operationMetrics"] for row in history if row["version"] == ref.version), {}) or {}
    return int(metrics.get("numOutputRows", 0))
