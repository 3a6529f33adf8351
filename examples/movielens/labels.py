"""Write the MovieLens-100K user labels the user_label tasks read: examples/movielens/data/labels.parquet.

    python examples/movielens/fetch.py        # writes data/events.parquet, items.parquet, users.parquet
    lumos ingest --recipe examples/movielens/ingest.toml
    python examples/movielens/labels.py       # reads the users and items files and the ingested table

One row per user: user_id, and
- gender (M or F), occupation (21 classes) and age_band, from users.parquet (the checksummed user
  file that ships beside the ratings); age is binned into the 7 bands MovieLens-1M uses
  (<18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+), so the task reads the same on both logs;
- genres: the genres of the user's held-out last rating (the leave-one-out test target, read from
  the ingested table's test rows, so it is exactly the rating the model never saw), "|"-separated.
  A label set, not a share: one movie has a set of genres (1 to 6 of 19), and a share over one
  movie would only spread 1 over its genres, saying nothing a set does not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
AGE_BANDS = ((18, "<18"), (25, "18-24"), (35, "25-34"), (45, "35-44"), (50, "45-49"), (56, "50-55"))
"""(upper bound, band): an age below the bound and at or above the previous one; 56 and over is "56+"."""
LABELS_FILE = "labels.parquet"


def age_band(age: int) -> str:
    for bound, band in AGE_BANDS:
        if age < bound:
            return band
    return "56+"


def last_rated_items(workspace_dir: Path, table: str = "movielens.sequences") -> dict[str, str]:
    """user id -> movie id of the user's test target (the last rating), from the ingested table."""
    from lumos.core.tables import TableRef, table_location
    from lumos.core.workspace import open_workspace
    from lumos.data.delta_snapshot import open_snapshot
    from lumos.data.sequences_version import ingest_lineage, open_sequences
    from lumos.eval.embeddings import split_rows

    workspace = open_workspace(workspace_dir)
    data = open_sequences(workspace, TableRef.parse(table))
    rows = split_rows(data, "test")
    _, vocab_ref = ingest_lineage(workspace, data.ref)  # the vocab version the sequences were written with
    vocab = pq.read_table([file.path for file in open_snapshot(table_location(workspace, vocab_ref), vocab_ref.version).files],
                          columns=["feature", "token", "id"])
    items = vocab.filter(pc.equal(vocab["feature"], data.spec.item_feature))
    movie_of = dict(zip(items["id"].to_pylist(), items["token"].to_pylist(), strict=True))
    return {user: movie_of[target] for user, target in zip(rows["user_id"].to_pylist(), rows["next_item"].to_pylist(),
                                                            strict=True)}


def user_labels(users: pa.Table, items: pa.Table, last_item: dict[str, str]) -> pa.Table:
    genres_of = dict(zip(items["item_id"].to_pylist(), items["genres"].to_pylist(), strict=True))
    user_ids = users["user_id"].to_pylist()
    return pa.table({
        "user_id": pa.array(user_ids, pa.string()),
        "gender": users["gender"],
        "age_band": pa.array([age_band(age) for age in users["age"].to_pylist()], pa.string()),
        "occupation": users["occupation"],
        "genres": pa.array(["|".join((genres_of[last_item[user]] or "").split()) if user in last_item else None
                            for user in user_ids], pa.string()),
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=HERE / "data", help="where fetch.py wrote its files")
    parser.add_argument("--workspace", type=Path, default=HERE, help="the workspace holding movielens.sequences")
    args = parser.parse_args(argv)
    missing = [name for name in ("users.parquet", "items.parquet") if not (args.data / name).exists()]
    if missing:
        print(f"error: no {', '.join(missing)} in {args.data}; run examples/movielens/fetch.py first", file=sys.stderr)
        return 2
    labels = user_labels(pq.read_table(args.data / "users.parquet"), pq.read_table(args.data / "items.parquet"),
                         last_rated_items(args.workspace))
    pq.write_table(labels, args.data / LABELS_FILE)
    print(f"{labels.num_rows} users' labels: {args.data / LABELS_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
