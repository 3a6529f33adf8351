#!/usr/bin/env bash
# MovieLens-100K end to end: fetch → ingest → train → eval, then the test metrics beside popularity.
#
#   examples/movielens/run.sh                       # fetches recbole==1.2.1 from PyPI (2 MB)
#   examples/movielens/run.sh --wheel PATH.whl      # or a downloaded wheel (any fetch.py option)
#   SEED=1 examples/movielens/run.sh                # another seed
#   TRAIN_SET="run.max_steps=20" examples/movielens/run.sh   # train.toml overrides (a smoke test)
#
# The workspace is examples/movielens/ (tables, MLflow store and checkpoints in its .lumos/, data
# in data/; both are git-ignored). About 9 minutes on 2 quiet CPU cores (8 min 51 s measured with
# the table already ingested, about 9 min 12 s with a first ingest), most of it training; see the
# README section "Real data: MovieLens-100K".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)          # the repository root
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's lumos, installed or not
export MLFLOW_DISABLE_TELEMETRY=true
EXAMPLE=examples/movielens
lumos() { python -m lumos --workspace "$EXAMPLE" "$@"; }

python "$ROOT/$EXAMPLE/fetch.py" --out "$ROOT/$EXAMPLE/data" "$@"   # from here: --u-data paths stay as typed
cd "$ROOT"
lumos ingest --recipe "$EXAMPLE/ingest.toml"
overrides=(--set "run.seed=${SEED:-0}")
for setting in ${TRAIN_SET:-}; do overrides+=(--set "$setting"); done
run_id=$(lumos train --config "$EXAMPLE/train.toml" "${overrides[@]}" --json |
         python -c 'import json, sys; print(json.load(sys.stdin)["run_id"])')
lumos eval --task movielens_next_item --run "$run_id"
