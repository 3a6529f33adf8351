#!/usr/bin/env bash
# An outside model on the quickstart world's next_item leaderboard: export → fit → submit → show.
#
#   examples/submissions/run.sh            # after `lumos quickstart` (README's first command)
#   WORKSPACE=path/to/project examples/submissions/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" MLFLOW_DISABLE_TELEMETRY=true
WORKSPACE=${WORKSPACE:-.}
OUT=$(mktemp -d)
lumos() { python -m lumos --workspace "$WORKSPACE" "$@"; }

lumos eval tasks export next_item --out "$OUT/next_item"
python "$ROOT/examples/submissions/item_knn.py" "$OUT/next_item" --out "$OUT/item_knn.parquet"
lumos eval --task next_item --predictions "$OUT/item_knn.parquet" --name acme/item-knn \
    --description "item-kNN, cosine over TF-IDF bags of items (examples/submissions)"
lumos eval leaderboard --task next_item
