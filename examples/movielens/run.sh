#!/usr/bin/env bash
# MovieLens-100K end to end: fetch → ingest → train → eval, then the test metrics beside popularity.
#
#   examples/movielens/run.sh                       # fetches recbole==1.2.1 from PyPI (2 MB)
#   examples/movielens/run.sh --u-data PATH/u.data  # or use the original file (any fetch.py option)
#   SEED=1 examples/movielens/run.sh                # another seed
#
# The workspace is examples/movielens/ (tables, MLflow store and checkpoints in its .lumos/, data
# in data/; both are git-ignored). About 12 minutes on 2 CPU cores, most of it training.
set -euo pipefail
cd "$(dirname "$0")/../.."                         # the repository root
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's lumos, installed or not
export MLFLOW_DISABLE_TELEMETRY=true
EXAMPLE=examples/movielens
lumos() { python -m lumos --workspace "$EXAMPLE" "$@"; }

python "$EXAMPLE/fetch.py" --out "$EXAMPLE/data" "$@"
lumos ingest --recipe "$EXAMPLE/ingest.toml"
run_id=$(lumos train --config "$EXAMPLE/train.toml" --set "run.seed=${SEED:-0}" --json |
         python -c 'import json, sys; print(json.load(sys.stdin)["run_id"])')
lumos eval --task movielens_next_item --run "$run_id"
