"""`lumos compile`: turn a trained model into verified native kernels and store the plan on its run."""

from __future__ import annotations

from typing import Annotated

import typer

from lumos.cli.output import echo, emit_json, handles_errors, print_table, progress, state
from lumos.core.errors import UsageError
from lumos.core.workspace import open_workspace


def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


@handles_errors
def compile_model(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", help="The MLflow training run to compile.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="A registered model, NAME@alias.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="cpu (gcc + OpenMP); default: [compile] target.")] = None,
    batch: Annotated[int, typer.Option("--batch", help="Rows per call the plan is built for; other sizes pad or chunk.")] = 256,
    seq: Annotated[int | None, typer.Option("--seq", help="History length the plan is built for (default: the data's max_len); shorter histories pad.")] = None,
    clear_cache: Annotated[bool, typer.Option("--clear-cache", help="Empty the kernel cache of the target first (alone: only that).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Compile a training run (--run) or registered model (--model) into fused C kernels.

    Traces the inference forward into primitive ops, fuses them into kernels, plans buffers by
    liveness, builds one shared library (kernel cache under the workspace's kernels/ folder),
    checks its outputs against PyTorch on random inputs and, only if they match, stores the plan
    as artifacts compile/TARGET of the training run, where `lumos infer --engine compiled` finds it.
    """
    from lumos.compile.engine import check_target, compile_run
    from lumos.compile.engine import clear_cache as clear
    from lumos.eval.evaluate import resolve_subject

    workspace = open_workspace(state(ctx).workspace_dir)
    target = target or workspace.settings.compile.target
    check_target(target)
    if clear_cache:
        removed = clear(workspace, target)
        if run is None and model is None:
            if json_output:
                emit_json({"target": target, "cleared": removed})
            else:
                echo(f"kernel cache ({target}): removed {removed} entr{'y' if removed == 1 else 'ies'}")
            return
    if (run is None) == (model is None):
        raise UsageError("name exactly one of --run RUN_ID or --model NAME@alias")
    subject = resolve_subject(workspace, run, model)
    with progress(f"compiling {subject.label} for {target}") as report:
        summary = compile_run(workspace, subject.run_id, target, batch, seq, report=report)
    stats = summary.stats
    if json_output:
        emit_json({"run_id": summary.run_id, "model": subject.model, "target": target, "batch": summary.batch_size,
                   "seq": summary.seq_len, **stats, "max_error": summary.max_error, "eager_ms": summary.eager_ms,
                   "compiled_ms": summary.compiled_ms, "cache_hit": summary.cache_hit, "seconds": summary.seconds,
                   "artifact": summary.artifact, "library": summary.library})
        return
    speedup = summary.eager_ms / summary.compiled_ms if summary.compiled_ms else float("nan")
    rows = [
        ("primitive ops in", f"{stats['primitive_ops']:,}"),
        ("kernels out", f"{stats['kernels']:,}"),
        ("fused ops", f"{stats['fused_ops']:,}"),
        ("planned peak memory", f"{_bytes(stats['planned_peak_bytes'])} (one buffer per node: {_bytes(stats['per_node_bytes'])})"),
        ("time per forward", f"{summary.compiled_ms:.2f} ms compiled vs {summary.eager_ms:.2f} ms torch eager ({speedup:.2f}x)"),
        ("max difference vs torch", f"{summary.max_error:.2e}"),
        ("kernel cache", "hit" if summary.cache_hit else f"built in {summary.seconds.get('build', 0):.1f} s"),
        ("plan", f"{summary.artifact} of run {summary.run_id}"),
    ]
    print_table(f"{subject.label} → {target}, batch {summary.batch_size}, sequence {summary.seq_len}", ["", ""], rows)
