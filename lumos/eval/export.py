"""`lumos eval tasks export`: what a team outside Lumos needs to enter a task's leaderboard.

The folder holds:

- `users.parquet`: one row per user of the task, sorted by user id, with the history up to the
  task's cutoff (`as_of`) exactly as a Lumos model reads it: token columns of vocab ids, numeric
  token columns, static user features and the known-future calendar flags. Never a label: the
  split, the next item and the act_<K>d / value_<K>d targets are left out.
- `vocab.parquet`: (feature, token, id), to read the ids back as the source's tokens (counts are
  left out: they are taken over every event, the held-out ones too).
- `items.parquet` (retrieval tasks): the item ids a submission may rank, with their tokens.
- `schema.json`: the submission schema (`submission_schema`), what `lumos eval tasks schema` prints.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import Workspace
from lumos.data.contract import FIRST_TOKEN_ID
from lumos.data.delta_snapshot import open_snapshot
from lumos.data.sequences_version import SequencesVersion, ingest_lineage, open_sequences
from lumos.eval.submission import prediction_of, task_users
from lumos.eval.tasks import LoadedTask, TaskSpec

LABEL_COLUMN = re.compile(r"^(split|next_item|(act|value)_\d+d)$")


@dataclass(frozen=True)
class Export:
    task: str
    data: str
    out: Path
    users: int
    items: int | None
    """Item ids a retrieval submission may rank; None for other kinds."""
    files: list[str]


def submission_schema(spec: TaskSpec) -> dict[str, Any]:
    """The columns and rules of a submission to `spec` (what the checks in lumos.eval.submission enforce)."""
    prediction = prediction_of(spec)
    rules = ["one row per user of users.parquet: none missing, none twice, no other user", *prediction.rules(spec)]
    return {
        "task": spec.name, "kind": spec.kind, "data": spec.data, "split": spec.split,
        "primary_metric": spec.primary_metric, "daily_submissions": spec.daily_submissions, "metrics": list(spec.metric_names),
        "columns": [{"name": "user_id", "type": "string", "description": "the user, as users.parquet names them"},
                    {"name": prediction.column, "type": prediction.type, "description": prediction.description}],
        "rules": rules,
        "formats": ["parquet", "csv (a list as JSON text: \"[12, 7, 33]\")", "delta (a table folder)"],
        "submit": f"lumos eval --task {spec.name} --predictions FILE --name TEAM/MODEL",
    }


def export_task(workspace: Workspace, task: LoadedTask, out: Path) -> Export:
    spec = task.spec
    schema = submission_schema(spec)  # refuses a kind that takes no submissions, before anything is read
    data = open_sequences(workspace, TableRef.parse(spec.data))
    users = task_users(spec, data)
    users = users.select([name for name in users.column_names if not LABEL_COLUMN.match(name)])
    vocab = _vocab(workspace, data)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(users, out / "users.parquet")
    pq.write_table(vocab, out / "vocab.parquet")
    files = ["users.parquet", "vocab.parquet"]
    items = None
    if spec.kind == "retrieval":
        item_rows = vocab.filter(pc.and_(pc.equal(vocab["feature"], data.spec.item_feature),
                                         pc.greater_equal(vocab["id"], FIRST_TOKEN_ID)))
        item_table = pa.table({"item_id": pc.cast(item_rows["id"], pa.int64()), "item": item_rows["token"]})
        pq.write_table(item_table, out / "items.parquet")
        files.append("items.parquet")
        items = item_table.num_rows
    (out / "schema.json").write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
    files.append("schema.json")
    return Export(spec.name, str(data.ref), out, users.num_rows, items, files)


def _vocab(workspace: Workspace, data: SequencesVersion) -> pa.Table:
    """The vocab version the sequences were made with: (feature, token, id), by feature and id."""
    _, vocab_ref = ingest_lineage(workspace, data.ref)
    snapshot = open_snapshot(table_location(workspace, vocab_ref), vocab_ref.version)
    table = pq.read_table([data_file.path for data_file in snapshot.files], columns=["feature", "token", "id"])
    return table.take(pc.sort_indices(table, [("feature", "ascending"), ("id", "ascending")]))
