"""`lumos doctor`: can this machine run the embedded defaults, and what is missing?

Required: Java, a Spark session with Delta, the MLflow store, a C compiler with OpenMP.
Optional: NVRTC (the cuda compile target's compiler) and a GPU with its driver and architecture
(only `compile --target cuda` beyond NVRTC, and GPU training, need one).
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
    from lumos.core.spark import delta_maven_coordinates, get_spark, jar_memory

    log_file = Path(tempfile.mkdtemp(prefix="lumos-doctor-")) / "spark.log"
    spark = get_spark(workspace.settings.spark, log_file=log_file)
    with tempfile.TemporaryDirectory() as folder:
        spark.range(3).write.format("delta").save(folder + "/probe")
        rows = spark.read.format("delta").load(folder + "/probe").count()
    if rows != 3:
        return Check("spark+delta", False, True, f"wrote 3 rows to a Delta table but read back {rows}")
    settings = workspace.settings.spark
    package = settings.delta_jars_dir or settings.delta_package or delta_maven_coordinates()
    if not settings.delta_jars_dir and not spark.sparkContext.getConf().contains("spark.jars.packages"):
        package += f", the jars Ivy resolved at an earlier start (listed in {jar_memory(package)})"
    return Check("spark+delta", True, True, f"Spark {spark.version}, {settings.master}, Delta from {package}")


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
    """NVRTC, which the cuda compile target builds with (no GPU needed); nvcc only as a note."""
    from importlib.metadata import PackageNotFoundError, version

    nvcc = find_nvcc(workspace)
    note = f"; nvcc at {nvcc} (not needed)" if nvcc else ""
    try:
        from cuda.bindings import nvrtc  # what lumos.compile.runtime.nvrtc builds with (core cannot import compile)

        _, major, minor = nvrtc.nvrtcVersion()
        found = f"{major}.{minor}"
    except Exception as error:  # ImportError when missing, RuntimeError when libnvrtc does not load
        return Check("cuda compiler", False, False, f"NVRTC not usable ({error}){note}",
                     "pip install 'lumos[cuda]' (cuda-bindings and nvidia-cuda-nvrtc); only the cuda target needs it")
    try:
        bindings = version("cuda-bindings")
    except PackageNotFoundError:
        bindings = "unknown"
    return Check("cuda compiler", True, False, f"NVRTC {found} (cuda-bindings {bindings}){note}")


def _cuda_launcher() -> str:
    """Which binding the CUDA runtime would launch kernels with (cuda_runtime.launcher)."""
    try:
        import pycuda

        return f"pycuda {pycuda.VERSION_TEXT}"
    except ImportError:
        pass
    try:
        from cuda.bindings import driver  # noqa: F401

        return "cuda.bindings.driver (pycuda not installed)"
    except ImportError:
        return "none (pip install 'lumos[cuda]')"


def _driver_version() -> str:
    try:
        from cuda.bindings import driver

        error, found = driver.cuDriverGetVersion()
        if error != driver.CUresult.CUDA_SUCCESS:
            return "no CUDA driver"
        return f"CUDA driver {found // 1000}.{found % 1000 // 10}"
    except Exception:  # no binding, or no libcuda to load
        return "no CUDA driver"


def check_gpu(workspace: Workspace) -> Check:
    import torch

    launcher = _cuda_launcher()
    if not torch.cuda.is_available():
        return Check("gpu", False, False, f"no CUDA GPU visible to torch ({_driver_version()}; launcher: {launcher}); "
                     "training and compile run on CPU, `compile --target cuda` stops after NVRTC",
                     "optional: on a GPU machine install the NVIDIA driver; Lumos uses it when present")
    gpus = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        gpus.append(f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    return Check("gpu", True, False, f"{'; '.join(gpus)}; {_driver_version()}; launcher: {launcher}")
