#!/usr/bin/env bash
# MovieLens-100K end to end: fetch → ingest → train → eval of every task in tasks/, each beside its baselines.
#
#   examples/movielens/run.sh                       # fetches recbole==1.2.1 from PyPI (2 MB)
#   examples/movielens/run.sh --wheel PATH.whl      # or a downloaded wheel (any fetch.py option)
#   SEED=1 examples/movielens/run.sh                # another seed
#   TRAIN_SET="run.max_steps=20" TIME_SET="run.max_steps=20" examples/movielens/run.sh   # a smoke test
#
# Two models are trained, one per protocol:
# - leave-one-out (ingest.toml → movielens.sequences, train.toml): every task on that table;
# - time split (ingest_before.toml: the ratings before 1998-03-08 only → movielens_before.sequences,
#   train.toml at TIME_STEPS steps): every task on movielens_cutoff.sequences (ingest_cutoff.toml,
#   the rows cut at that date), i.e. movielens_time_split. Nothing after the cutoff reaches it.
# A task joins the run by being a file in tasks/: the loop below reads each file's `data` and
# scores it with the model trained on that protocol (a new table needs its ingest above and a
# line in `model_for`).
#
# The workspace is examples/movielens/ (tables, MLflow store and checkpoints in its .lumos/, data
# in data/; both are git-ignored). Budget: 15 minutes on 2 quiet cores. Measured before the time
# split was added: 8 min 51 s with the table already ingested (README "Real data: MovieLens-100K"),
# most of it the leave-one-out training; the time split adds two ingests (about 35 s each) and a
# 600-step training (2,500 steps took 8 min 24 s, so about 2 min). Not yet timed on quiet cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)          # the repository root
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's lumos, installed or not
export MLFLOW_DISABLE_TELEMETRY=true
EXAMPLE=examples/movielens
lumos() { python -m lumos --workspace "$EXAMPLE" "$@"; }
train() {  # train.toml with the given --set overrides; prints the run id
    lumos train --config "$EXAMPLE/train.toml" --set "run.seed=${SEED:-0}" "$@" --json |
        python -c 'import json, sys; print(json.load(sys.stdin)["run_id"])'
}
overrides() { for setting in $1; do printf -- '--set\n%s\n' "$setting"; done; }

python "$ROOT/$EXAMPLE/fetch.py" --out "$ROOT/$EXAMPLE/data" "$@"   # from here: --u-data paths stay as typed
cd "$ROOT"
for recipe in ingest ingest_before ingest_cutoff; do
    lumos ingest --recipe "$EXAMPLE/$recipe.toml"
done
python "$EXAMPLE/labels.py"   # the user_label tasks' labels: users.parquet and the held-out ratings' genres

mapfile -t loo_set < <(overrides "${TRAIN_SET:-}")
mapfile -t time_set < <(overrides "run.max_steps=${TIME_STEPS:-600} ${TIME_SET:-}")
loo_run=$(train "${loo_set[@]}")
time_run=$(train --set data.table=movielens_before.sequences "${time_set[@]}")

model_for() {  # the run that scores a task, by the table the task reads
    case "$1" in
        movielens_cutoff.*) echo "$time_run" ;;
        *) echo "$loo_run" ;;
    esac
}
declare -A tasks_of=()
for task_file in "$EXAMPLE"/tasks/*.toml; do
    data=$(python -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["data"])' "$task_file")
    run=$(model_for "$data")
    tasks_of[$run]+=" --task $(basename "$task_file" .toml)"
done
for run in "${!tasks_of[@]}"; do
    # shellcheck disable=SC2086  # the task flags split on purpose
    lumos eval ${tasks_of[$run]} --run "$run"   # one call per model: probe tasks share its embeddings
done
