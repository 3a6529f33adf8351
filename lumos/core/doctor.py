"""`lumos doctor`: can this machine run the embedded defaults, and what is missing?

Required: Java, a Spark session with Delta, the MLflow store, a C compiler with OpenMP.
Optional: a CUDA compiler and a GPU (only the cuda compile target and GPU training need them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lumos.core.workspace import Workspace


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    required: bool
    detail: str
    """What was found, or what went wrong."""
    fix: str = ""
    """What to do when the check fails."""


def run_checks(workspace: Workspace, report: Callable[[str], None] = lambda _: None) -> list[Check]:
    checks = []
    for name, check in [
        ("java", check_java),
        ("spark+delta", check_spark),
        ("mlflow", check_mlflow),
        ("c compiler", check_c_compiler),
        ("cuda compiler", check_cuda_compiler),
        ("gpu", check_gpu),
    ]:
        report(f"checking {name}")
        try:
            checks.append(check(workspace))
        except Exception as error:  # a check must report, never crash the doctor
            checks.append(Check(name, False, name not in ("cuda compiler", "gpu"), f"{type(error).__name__}: {error}"))
    return checks


def check_java(workspace: Workspace) -> Check:
    fix = "install a Java 17 runtime (e.g. apt-get install openjdk-17-jre-headless) and put java on PATH or set JAVA_HOME"
    java = shutil.which("java")
    if java is None:
        return Check("java", False, True, "java not found on PATH", fix)
    output = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    match = re.search(r'version "(\d+)', output)
    major = int(match.group(1)) if match else 0
    if major < 17:
        return Check("java", False, True, f"found Java {major or 'of unknown version'}; Spark 4 needs 17 or newer", fix)
    return Check("java", True, True, output.splitlines()[0].strip())


def check_spark(workspace: Workspace) -> Check:
    from lumos.core.spark import delta_maven_coordinates, get_spark

    log_file = Path(tempfile.mkdtemp(prefix="lumos-doctor-")) / "spark.log"
    spark = get_spark(workspace.settings.spark, log_file=log_file)
    with tempfile.TemporaryDirectory() as folder:
        spark.range(3).write.format("delta").save(folder + "/probe")
        rows = spark.read.format("delta").load(folder + "/probe").count()
    if rows != 3:
        return Check("spark+delta", False, True, f"wrote 3 rows to a Delta table but read back {rows}")
    package = workspace.settings.spark.delta_jars_dir or workspace.settings.spark.delta_package or delta_maven_coordinates()
    return Check("spark+delta", True, True, f"Spark {spark.version}, {workspace.settings.spark.master}, Delta from {package}")


def check_mlflow(workspace: Workspace) -> Check:
    import mlflow

    from lumos.core.tracking import tracking_client

    tracking_client(workspace).search_experiments(max_results=1)
    return Check("mlflow", True, True, f"MLflow {mlflow.__version__} store at {workspace.mlflow_tracking_uri}")


def check_c_compiler(workspace: Workspace) -> Check:
    settings = workspace.settings.compile
    fix = f"install gcc with OpenMP (apt-get install gcc) or set [compile] cc; flags in use: {' '.join(settings.cflags)}"
    compiler = shutil.which(settings.cc)
    if compiler is None:
        return Check("c compiler", False, True, f"{settings.cc} not found on PATH", fix)
    program = "#include <omp.h>\n#include <stdio.h>\nint main(void){printf(\"%d\", omp_get_max_threads());return 0;}\n"
    with tempfile.TemporaryDirectory() as folder:
        source, binary = Path(folder, "probe.c"), Path(folder, "probe")
        source.write_text(program)
        built = subprocess.run([compiler, *settings.cflags, str(source), "-o", str(binary)], capture_output=True, text=True)
        if built.returncode != 0:
            return Check("c compiler", False, True, f"{settings.cc} failed: {built.stderr.strip()[:300]}", fix)
        threads = subprocess.run([str(binary)], capture_output=True, text=True, timeout=30).stdout.strip()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return Check("c compiler", True, True, f"{version}; OpenMP with {threads} threads")


def find_nvcc(workspace: Workspace) -> str | None:
    """nvcc from config, PATH, or the nvidia-cuda-nvcc wheel."""
    if workspace.settings.compile.nvcc:
        return workspace.settings.compile.nvcc
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    for site in map(Path, sys.path):
        for candidate in (site / "nvidia" / "cuda_nvcc" / "bin" / "nvcc", site / "nvidia" / "cu13" / "bin" / "nvcc"):
            if candidate.is_file():
                return str(candidate)
    return None


def check_cuda_compiler(workspace: Workspace) -> Check:
    nvcc = find_nvcc(workspace)
    if nvcc is None:
        return Check("cuda compiler", False, False, "no nvcc found (only the cuda compile target needs it)",
                     "pip install nvidia-cuda-nvcc, or install the CUDA toolkit, or set [compile] nvcc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    return Check("cuda compiler", True, False, f"{nvcc}: {version[-1] if version else 'version unknown'}")


def check_gpu(workspace: Workspace) -> Check:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Check("gpu", False, False, "no NVIDIA GPU driver found (training and compile run on CPU)",
                     "optional: on a GPU machine install the NVIDIA driver; Lumos uses it when present")
    query = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True)
    if query.returncode != 0 or not query.stdout.strip():
        return Check("gpu", False, False, f"nvidia-smi failed: {query.stderr.strip()[:200]}")
    return Check("gpu", True, False, "; ".join(line.strip() for line in query.stdout.splitlines()))
