"""Ingest's modules stay free of torch: Spark's Python workers import them to build the rows, and
torch cost each worker 1.4 s of import (and the `lumos ingest` process as much again)."""

import subprocess
import sys


def test_ingest_and_its_row_builders_do_not_import_torch():
    probe = ("import sys, lumos.cli.ingest, lumos.data.ingest, lumos.data.sequence_files, lumos.data.time_rows; "
             "print(sorted(name for name in ('torch', 'mlflow') if name in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
