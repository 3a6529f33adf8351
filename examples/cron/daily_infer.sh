#!/usr/bin/env bash
# Nightly batch predictions for every user with the production model.
#
# crontab line (02:30 UTC every day; cron has no terminal, so lumos logs plain timestamped lines):
#   30 2 * * *  /path/to/project/examples/cron/daily_infer.sh >> /var/log/lumos/daily_infer.log 2>&1
#
# Settings (environment, all optional):
#   LUMOS_PROJECT  project folder holding lumos.toml          (default: two levels above this script)
#   LUMOS_MODEL    registered model and alias                 (default: quickstart@production)
#   LUMOS_AS_OF    date to predict for, YYYY-MM-DD            (default: today, UTC)
#   LUMOS_SOURCE   today's events, when they moved since training (default: the source in the model's lineage)
#   LUMOS_BIN      the lumos command                          (default: lumos on PATH)
#
# Exit codes are lumos's own: 0 written; 1 failure, or another run holds the same date (retry
# later); 2 bad input such as a missing source or unknown model (nothing written; fix, then rerun).
# Rerunning for a date replaces exactly that date's partition, so a retry is always safe.
set -euo pipefail

project="${LUMOS_PROJECT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
model="${LUMOS_MODEL:-quickstart@production}"
as_of="${LUMOS_AS_OF:-$(date -u +%F)}"
lumos="${LUMOS_BIN:-lumos}"

args=(--workspace "$project" infer --model "$model" --as-of "$as_of" --json)
if [[ -n "${LUMOS_SOURCE:-}" ]]; then
  args+=(--source "$LUMOS_SOURCE")
fi

summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
status=0
"$lumos" "${args[@]}" > "$summary" || status=$?
if [[ $status -eq 0 ]]; then
  echo "$(date -u +%FT%TZ) daily_infer: ok $(tr -d '\n ' < "$summary")"
else
  echo "$(date -u +%FT%TZ) daily_infer: lumos infer exited $status for $model as of $as_of" >&2
fi
exit $status
