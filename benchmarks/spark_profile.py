"""Where a timed Lumos run's time goes, from Spark's event log: per step, its seconds, jobs,
stages, rows read from files and bytes shuffled. Used by the benchmarks' `--profile`."""

from __future__ import annotations

import json
from pathlib import Path

EVENT_LOG_CONF = {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false"}


def last_job_id(spark) -> int:
    ids = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    return max(ids, default=-1)


def print_profile(event_log_dir: Path, job_ids: tuple[int, int]) -> None:
    """Per step of the timed run whose Spark jobs are `job_ids` (first, last; named by the Lumos
    verb's steps, else by call site): the seconds from its first job's start to its last job's
    end, jobs, stages, rows read from files and bytes shuffled."""
    jobs: dict[int, dict] = {}
    stage_job: dict[int, int] = {}
    for log in sorted(path for path in event_log_dir.rglob("*") if path.is_file()):
        for line in log.read_text().splitlines():
            if not line.startswith("{"):  # the log folder also holds an empty status file
                continue
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerJobStart" and job_ids[0] <= event["Job ID"] <= job_ids[1]:
                description = event.get("Properties", {}).get("spark.job.description") or "(other Spark work)"
                jobs[event["Job ID"]] = {"start": event["Submission Time"], "what": description, "stages": 0,
                                         "rows_in": 0, "shuffle_mb": 0.0}
                for stage in event["Stage IDs"]:
                    stage_job[stage] = event["Job ID"]
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                jobs[event["Job ID"]]["end"] = event["Completion Time"]
            elif kind == "SparkListenerStageCompleted" and event["Stage Info"]["Stage ID"] in stage_job:
                info = event["Stage Info"]
                job = jobs[stage_job[info["Stage ID"]]]
                job["stages"] += 1
                for accumulable in info.get("Accumulables", []):
                    name, value = accumulable.get("Name", ""), accumulable.get("Value", 0)
                    if name == "internal.metrics.input.recordsRead":
                        job["rows_in"] += int(value)
                    elif name == "internal.metrics.shuffle.write.bytesWritten":
                        job["shuffle_mb"] += int(value) / 2**20
    steps: dict[str, dict] = {}
    for job in sorted(jobs.values(), key=lambda job: job["start"]):
        step = steps.setdefault(job["what"], {"start": job["start"], "end": job["start"], "jobs": 0, "stages": 0,
                                              "rows_in": 0, "shuffle_mb": 0.0})
        step["end"] = max(step["end"], job.get("end", job["start"]))
        step["jobs"] += 1
        for key in ("stages", "rows_in", "shuffle_mb"):
            step[key] += job[key]
    print(f"{'seconds':>8} {'jobs':>5} {'stages':>6} {'rows in':>11} {'shuffle MB':>10}  step")
    for what, step in steps.items():
        print(f"{(step['end'] - step['start']) / 1000:>8.2f} {step['jobs']:>5} {step['stages']:>6} "
              f"{step['rows_in']:>11,} {step['shuffle_mb']:>10.1f}  {what}")
