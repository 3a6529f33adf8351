"""A pinned version of `<dataset>.sequences` and its `FeatureSpec`, read from the Delta log alone.

The recipe and the exact vocab version come from the lineage record in the version's commit, so
whatever trains on a table version also knows how it was made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageRecord
from lumos.core.tables import TableRef, logged_history, table_location
from lumos.core.workspace import Workspace
from lumos.data.contract import TIME_FEATURES, FeatureSpec
from lumos.data.delta_snapshot import DeltaSnapshot, open_snapshot
from lumos.data.user_share import UserShare

# Columns of the sequences table that are neither features nor targets.
KEY_COLUMNS = ("user_id", "split", "as_of", "length")
# History id columns with a vocabulary (event features); the time features have fixed sizes.
_VOCAB_TOKEN = re.compile(r"^(item|event_type|cat_.+|item_.+)$")
_HORIZON = re.compile(r"^(act|value)_(\d+)d$")
MIN_VOCAB_SIZE = 2  # padding and OOV exist even when no token made the vocabulary



def feature_spec_for(
    sequences: DeltaSnapshot | str | Path, vocab: DeltaSnapshot | str | Path, recipe: Mapping[str, Any]
) -> FeatureSpec:
    """Derive the FeatureSpec of a sequences table from its Parquet schema and its vocab table.

    History list<int> columns are categorical (vocab size = max id + 1, at least 2; hour, weekday
    and gap_bucket have fixed sizes), other history lists numeric (value, num_*, item_*, count,
    age_days); user_<name> ints are static categorical, floats static numeric; future_<flag>
    arrays are calendar flags; act_<K>d/value_<K>d give the horizons; max_len is the recipe's
    tokens.max_len. `sequences`/`vocab` are snapshots or table folders (latest version).
    """
    sequences, vocab = _snapshot(sequences), _snapshot(vocab)
    schema = _arrow_schema(sequences)
    sizes = vocab_sizes(vocab)
    token_categorical: dict[str, int] = {}
    token_numeric: list[str] = []
    static_categorical: dict[str, int] = {}
    static_numeric: list[str] = []
    future_flags: list[str] = []
    horizons: dict[str, list[int]] = {"act": [], "value": []}
    for column in schema:
        name, kind = column.name, column.type
        if name in KEY_COLUMNS or name == "next_item":
            continue
        if match := _HORIZON.match(name):
            horizons[match[1]].append(int(match[2]))
        elif name.startswith("future_") and _is_list_of(kind, pa.types.is_integer):
            future_flags.append(name.removeprefix("future_"))
        elif name.startswith("user_") and pa.types.is_integer(kind):
            static_categorical[name] = max(sizes.get(name, 0), MIN_VOCAB_SIZE)
        elif name.startswith("user_") and pa.types.is_floating(kind):
            static_numeric.append(name)
        elif name in TIME_FEATURES and _is_list_of(kind, pa.types.is_integer):
            token_categorical[name] = TIME_FEATURES[name]
        elif _VOCAB_TOKEN.match(name) and _is_list_of(kind, pa.types.is_integer):
            token_categorical[name] = max(sizes.get(name, 0), MIN_VOCAB_SIZE)
        elif _is_list_of(kind, lambda t: pa.types.is_integer(t) or pa.types.is_floating(t)):
            token_numeric.append(name)
        else:
            raise UsageError(f"{sequences}: column {name} ({kind}) is not a sequences column the loader knows")
    if horizons["act"] != horizons["value"]:
        raise UsageError(f"{sequences}: act_<K>d columns {horizons['act']} do not match value_<K>d {horizons['value']}")
    return FeatureSpec(
        token_categorical=token_categorical,
        token_numeric=tuple(token_numeric),
        static_categorical=static_categorical,
        static_numeric=tuple(static_numeric),
        future_flags=tuple(future_flags),
        horizons_days=tuple(horizons["act"]),
        next_item="next_item" in schema.names,
        max_len=int(recipe["tokens"]["max_len"]),
    )


def vocab_sizes(vocab: DeltaSnapshot) -> dict[str, int]:
    """Feature → max id + 1 over the vocab table's rows."""
    if not vocab.files:
        return {}
    table = pq.read_table([data_file.path for data_file in vocab.files], columns=["feature", "id"])
    maxima = table.group_by("feature").aggregate([("id", "max")])
    return {feature: int(top) + 1 for feature, top in zip(maxima["feature"].to_pylist(), maxima["id_max"].to_pylist(), strict=True)}


@dataclass(frozen=True)
class SequencesVersion:
    """A pinned sequences version with everything needed to load it."""

    ref: TableRef
    snapshot: DeltaSnapshot
    recipe: dict[str, Any]
    """The ingest recipe that wrote it (from the commit's lineage record)."""
    spec: FeatureSpec
    vocab: DeltaSnapshot | None = None
    """The vocab version the sequences were made with (item tokens → ids), when opened from a workspace."""
    users: UserShare | None = None
    """When set, only this side of a split's users is read (a leaderboard's public or private part)."""

    def side(self, users: UserShare | None) -> SequencesVersion:
        """The same version, read on one side of a split's users (None: all of them)."""
        return replace(self, users=users)


def open_sequences(workspace: Workspace, ref: TableRef) -> SequencesVersion:
    """Resolve `dataset.sequences[@version]` in a local workspace, with its recipe, vocab version
    (both from the commit's lineage) and FeatureSpec."""
    snapshot = open_snapshot(table_location(workspace, ref), ref.version)
    pinned = ref.at(snapshot.version)
    lineage, vocab_ref = ingest_lineage(workspace, pinned)
    vocab = open_snapshot(table_location(workspace, vocab_ref), vocab_ref.version)
    spec = feature_spec_for(snapshot, vocab, lineage.config)
    return SequencesVersion(pinned, snapshot, lineage.config, spec, vocab)


def ingest_lineage(workspace: Workspace, pinned: TableRef) -> tuple[LineageRecord, TableRef]:
    """The ingest lineage in the commit of sequences version `pinned`, and the vocab version it names."""
    commits = logged_history(table_location(workspace, pinned))
    try:
        (lineage,) = [commit.lineage for commit in commits if commit.version == pinned.version and commit.lineage]
        return lineage, TableRef.parse(lineage.stats["tables"]["vocab"])
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(
            f"{pinned} has no ingest lineage naming its recipe and vocab version; re-ingest it with lumos ingest, "
            "or call feature_spec_for(sequences, vocab, recipe) with them"
        ) from error


def _snapshot(table: DeltaSnapshot | str | Path) -> DeltaSnapshot:
    return table if isinstance(table, DeltaSnapshot) else open_snapshot(table)


def _arrow_schema(snapshot: DeltaSnapshot) -> pa.Schema:
    if not snapshot.files:
        raise UsageError(f"{snapshot} has no data files")
    return pq.read_schema(snapshot.files[0].path)


def _is_list_of(kind: pa.DataType, predicate) -> bool:
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and predicate(kind.value_type)
