"""The Parquet files of one version of a local Delta table, for readers that open them with pyarrow.

delta-rs (`deltalake`, through `lumos.core.tables.open_delta_table`) replays the log. The
training loader and the vocab reader then read the listed files directly, one row group at a
time, so they miss what Delta applies on top of a file: deletion vectors (rows deleted beside an
unchanged file) and column mapping (Parquet column names that differ from the table's). A
snapshot refuses both. Lumos's writers use neither (`tests/integration/test_delta_reads.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lumos.core.errors import LumosError, UsageError
from lumos.core.tables import open_delta_table


@dataclass(frozen=True)
class DataFile:
    path: str
    """Absolute local path of the Parquet file."""
    size: int
    """Size in bytes, as the log records it."""
    partition_values: dict[str, Any] = field(default_factory=dict)
    """Its partition's values, typed as the column is (a date column's are dates)."""


@dataclass(frozen=True)
class DeltaSnapshot:
    """One version of a table: its live data files (sorted by path) and partitioning."""

    table_path: str
    version: int
    files: tuple[DataFile, ...]
    partition_columns: tuple[str, ...] = ()

    @property
    def size_bytes(self) -> int:
        return sum(data_file.size for data_file in self.files)

    def __str__(self) -> str:
        return f"{self.table_path}@{self.version}"


def open_snapshot(table_path: str | Path, version: int | None = None) -> DeltaSnapshot:
    """The files of `version` of a local table (the latest when None)."""
    import pyarrow as pa

    table = open_delta_table(str(table_path), version)
    _refuse_what_the_files_alone_miss(table, str(table_path))
    # From the Arrow stream: pa.table(...) would first check for a pandas frame, importing pandas (0.5 s).
    adds = pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=False)).read_all()
    partitions = adds["partition"].to_pylist() if "partition" in adds.column_names else [{}] * adds.num_rows
    files = []
    # delta-rs lists the URIs (decoded, absolute) and the add actions (as logged) in one order.
    for uri, logged, size, values in zip(table.file_uris(), adds["path"].to_pylist(), adds["size_bytes"].to_pylist(),
                                         partitions, strict=True):
        if Path(uri).name != Path(unquote(logged)).name:
            raise LumosError(f"{table_path}: delta-rs listed {uri} beside the add action of {logged}")
        if "://" in uri:
            raise UsageError(f"{table_path}: {uri} is not a local file; only local tables can be read without Spark")
        files.append(DataFile(uri, size, values or {}))
    return DeltaSnapshot(str(table_path), table.version(), tuple(sorted(files, key=lambda data_file: data_file.path)),
                         tuple(table.metadata().partition_columns))


def _refuse_what_the_files_alone_miss(table, name: str) -> None:
    if "deletionVectors" in (table.protocol().reader_features or ()) and table.deletion_vectors().read_all().num_rows:
        raise UsageError(
            f"{name}@{table.version()} has files with deletion vectors, which a reader of its Parquet files "
            "would not apply. Rewrite the table without them (disable delta.enableDeletionVectors and run "
            "REORG TABLE … APPLY (PURGE)), or read it with Spark"
        )
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise UsageError(
            f"{name}: column mapping mode {mode!r} (Parquet column names differ from the table's); "
            "only mode 'none' can be read from its files; read the table with Spark"
        )
