"""A leaderboard entry from outside Lumos: item-kNN over bags of items, for a retrieval task.

What a team does with `lumos eval tasks export`: read the users' histories, fit its own model on
them (here, cosine similarity between items over TF-IDF-weighted bags of items: items that share
users are similar), write one ranked list per user in the task's schema, and submit it.

    lumos eval tasks export next_item --out next_item/
    python examples/submissions/item_knn.py next_item/ --out item_knn.parquet
    lumos eval --task next_item --predictions item_knn.parquet --name acme/item-knn \\
        --description "item-kNN, cosine over TF-IDF bags of items"

Only the exported files are read (no label is in them): the model is fitted on the histories.
Items a user already has are ranked last, since the task excludes them anyway. `run.sh` does the
three steps on the quickstart world.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy import sparse
from sklearn.feature_extraction.text import TfidfTransformer
from sklearn.preprocessing import normalize


def bags_of_items(histories: list[list[int]], items: np.ndarray) -> sparse.csr_matrix:
    """(users, items) counts of each item in each history; ids outside `items` (padding) are dropped."""
    column = {int(item): position for position, item in enumerate(items)}
    rows, columns = [], []
    for user, history in enumerate(histories):
        for item in history:
            if item in column:
                rows.append(user)
                columns.append(column[item])
    counts = sparse.csr_matrix((np.ones(len(rows)), (rows, columns)), shape=(len(histories), len(items)))
    counts.sum_duplicates()
    return counts


def item_knn_scores(bags: sparse.csr_matrix, neighbours: int = 50) -> np.ndarray:
    """(users, items) scores: each user's TF-IDF bag times the item-item cosine similarities, each
    item keeping its `neighbours` most similar items (the usual item-kNN pruning)."""
    weighted = TfidfTransformer().fit_transform(bags)
    by_item = normalize(weighted.T.tocsr())  # rows: items over users, unit length
    similarity = (by_item @ by_item.T).toarray()
    np.fill_diagonal(similarity, 0.0)
    if neighbours < similarity.shape[1]:
        weakest = np.argpartition(-similarity, neighbours, axis=1)[:, neighbours:]
        np.put_along_axis(similarity, weakest, 0.0, axis=1)
    popularity = np.asarray(bags.sum(axis=0)).ravel()
    # Popularity breaks ties (users whose items have no neighbours still get a ranking).
    return np.asarray(weighted @ similarity) + 1e-9 * popularity / max(popularity.max(), 1.0)


def ranked_lists(scores: np.ndarray, bags: sparse.csr_matrix, items: np.ndarray, length: int) -> list[list[int]]:
    """Each user's `length` best items, the ones already in the history last."""
    scores = scores - np.where(bags.toarray() > 0, np.inf, 0.0)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :length]
    return items[top].tolist()


def needed_length(schema: dict) -> int:
    """The largest k among the task's metrics (a list must be at least that long)."""
    ks = [int(k) for metric in schema["metrics"] for k in re.findall(r"@(\d+)", metric)]
    return max(ks, default=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, help="a folder written by `lumos eval tasks export`")
    parser.add_argument("--out", type=Path, required=True, help="the predictions file to write (Parquet)")
    parser.add_argument("--neighbours", type=int, default=50, help="similar items each item keeps")
    args = parser.parse_args()
    schema = json.loads((args.export / "schema.json").read_text())
    if schema["kind"] != "retrieval":
        parser.error(f"{args.export}: task {schema['task']} is a {schema['kind']} task; this example ranks items")
    users = pq.read_table(args.export / "users.parquet", columns=["user_id", "item"])
    items = np.sort(pq.read_table(args.export / "items.parquet", columns=["item_id"])["item_id"].to_numpy())
    bags = bags_of_items(users["item"].to_pylist(), items)
    scores = item_knn_scores(bags, args.neighbours)
    top_items = ranked_lists(scores, bags, items, needed_length(schema))
    pq.write_table(pa.table({"user_id": users["user_id"], "top_items": pa.array(top_items, pa.list_(pa.int64()))}), args.out)
    print(f"{args.out}: {users.num_rows:,} users, {len(top_items[0]) if top_items else 0} items each")


if __name__ == "__main__":
    main()
