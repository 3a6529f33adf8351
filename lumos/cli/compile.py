"""`lumos compile`: turn a trained model into verified native kernels and store the plan on its run."""

from __future__ import annotations

from typing import Annotated

import typer

from lumos.cli.options import JsonOption, ModelOption, RunOption, given
from lumos.cli.output import echo, emit_json, handles_errors, json_data, print_table, progress, renamed, state
from lumos.core.errors import UsageError
from lumos.core.workspace import open_workspace


def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _search_line(summary) -> str:
    if summary.target == "cuda":
        return "not on CUDA yet (each kernel's frame is chosen from its shape, render/cuda.py)"
    if not summary.search:
        return "off (--no-search)"
    searched = sum(not group["cached"] for group in summary.search)
    text = (f"{len(summary.search)} distinct kernels, {searched} searched in {summary.search_rounds} rounds "
            f"({summary.seconds.get('search', 0):.1f} s)")
    text += ", all from the search cache" if summary.search_cache_hit else ""
    confirmed = summary.search_confirmed
    if confirmed:
        verdict = "kept" if confirmed["kept"] else "not kept, the renderer's defaults are used"
        text += f"; whole call {confirmed['searched_ms']:.2f} ms vs {confirmed['baseline_ms']:.2f} ms unsearched: {verdict}"
    return text


def _attention_line(attention: dict | None) -> str:
    if not attention:
        return "none found"
    rules = ", ".join(f"{name}×{count}" for name, count in attention["rules"].items())
    verdict = "kept" if attention["chosen"] else ("not kept: slower" if attention["verified"] else "not kept: unverified")
    times = (f"whole call {attention['fused_ms']:.2f} ms vs {attention['unfused_ms']:.2f} ms unfused, both searched"
             if attention["verified"] else "does not build or differs from the interpreter")
    staged = attention.get("staged_keys")
    if staged and staged["verified"]:
        times += (f"; keys read untransposed {staged['staged_ms']:.2f} ms vs {staged['copies_ms']:.2f} ms through "
                  f"transposed copies: {'staged' if staged['chosen'] else 'copies'} kept")
    return (f"{attention['matches']} online-softmax kernel(s) ({rules}); {verdict} ({times}); "
            f"score matrices not written: {_bytes(attention['score_bytes_not_written'])}")


def _egraph_line(egraph: dict | None) -> str:
    if not egraph:
        return "off"
    rules = ", ".join(f"{name}×{count}" for name, count in egraph["rules"].items()) or "none fired"
    return (f"{egraph['enodes']:,} e-nodes in {egraph['eclasses']:,} e-classes, saturated in {egraph['saturate_s']:.2f} s, "
            f"extracted in {egraph['extract_s']:.2f} s; {egraph['ops_before']} → {egraph['ops_after']} ops ({rules})")


def _cost_model_line(cost_model: dict | None) -> str:
    if not cost_model or cost_model.get("spearman_within") is None:
        return "too few candidates measured to rank"
    over_all = f"{cost_model['spearman_all']:.2f}" if cost_model["spearman_all"] is not None else "-"
    return (f"rank correlation with measurement (Spearman): {cost_model['spearman_within']:.2f} within kernels "
            f"({cost_model['groups']} kernels), {over_all} over all {cost_model['measured']} candidates; its predicted "
            f"best was within 5% of the measured best in {cost_model['top1']:.0%} of {cost_model['ranked_kernels']} "
            f"kernels; machine {cost_model['gflops']:.0f} GFLOP/s, {cost_model['gbytes']:.0f} GB/s")


def _fusion_line(fusion: dict | None) -> str:
    if not fusion:
        return "no prologue or epilogue to store instead"
    tried = [step for step in fusion["steps"] if "ms" in step]
    text = (f"{fusion['sites']} sites in the e-graph ({fusion['enodes']:,} e-nodes); {len(tried)} tried as whole calls, "
            f"{len(fusion['stored'])} kept")
    return text + (" (cached)" if fusion.get("cached") else "")


def _fusion_step(step: dict) -> str:
    if "ms" not in step:
        return f"  {step['site']}: {step.get('rejected', 'not tried')}"
    verdict = "kept" if step["kept"] else "not kept"
    return f"  {step['site']}: {step['ms']:.3f} ms vs {step['before_ms']:.3f} ms, {verdict}"


def program_lines(programs: dict) -> list[str]:
    """--explain with --egraph-fusion: each fusion the e-graph proposed that the scheduler would not
    have made, whether the kept program has it, and the programs timed (whole call, against the
    best so far)."""
    proposed = programs["proposed"]
    size = f"{programs['enodes']:,} e-nodes; " if programs["enodes"] is not None else ""
    lines = [f"e-graph programs: {len(proposed)} proposals the scheduler would not make ({size}"
             + (", ".join(f"{name}×{count}" for name, count in programs["rules"].items()) or "no rule fired")
             + f"), {len(programs['tried'])} programs timed, {len(programs['kept'])} proposals kept"]
    lines += [f"  {'kept' if p['kept'] else 'not kept'}: {p['describe']}" for p in proposed]
    for tried in programs["tried"]:
        genes = "; ".join(tried["genes"]) or "the scheduler's program"
        if tried["rejected"]:
            verdict = tried["rejected"]
        elif tried["ms"] is None:
            verdict = "not timed"
        else:
            verdict = f"{tried['ms']:.3f} ms vs {tried['against_ms']:.3f} ms" + (", kept" if tried["kept"] else "")
        lines.append(f"  timed [{genes}]: {verdict}")
    return lines


def _explain_row(group: dict) -> tuple:
    names = ", ".join(group["kernels"][:3]) + (f" (+{len(group['kernels']) - 3})" if len(group["kernels"]) > 3 else "")
    rules = ", ".join(f"{name}×{count}" for name, count in group["rules"].items()) or "-"
    tried = f"{group['tried']}/{group['candidates']}" + (" (cached)" if group["cached"] else "")
    alternatives = "; ".join(f"{alt['schedule']} {_ms(alt['ms']) if not alt['rejected'] else alt['rejected']}"
                             for alt in group.get("alternatives", [])[:ALTERNATIVES_SHOWN])
    return (names, group["kind"], "×".join(map(str, group["shape"])), rules, tried, _ms(group["baseline_ms"]),
            f"{_ms(group['best_ms'])} ({group['best']})", _ms(group["worst_ms"]), alternatives or "-")


ALTERNATIVES_SHOWN = 6
"""Alternatives per kernel in --explain, fastest first (--json has them all)."""


@handles_errors
def compile_model(
    ctx: typer.Context,
    run: RunOption = None,
    model: ModelOption = None,
    target: Annotated[str | None, typer.Option("--target", help="cpu (gcc + OpenMP) or cuda (NVRTC; verifying and timing need a GPU, else exit 1 after building); default: [compile] target.")] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="Rows per call the plan is built for; other sizes pad or chunk.")] = None,
    seq: Annotated[int | None, typer.Option("--seq", help="History length the plan is built for (default: the data's max_len); shorter histories pad.")] = None,
    clear_cache: Annotated[bool, typer.Option("--clear-cache", help="Empty the kernel cache of the target first (alone: only that).")] = False,
    search_budget: Annotated[float | None, typer.Option("--search-budget", metavar="SECONDS", help="Time to search kernel schedules by measurement (results are cached per kernel and machine).")] = None,
    no_search: Annotated[bool, typer.Option("--no-search", help="Skip the search: the renderer's heuristic schedules.")] = False,
    egraph_fusion: Annotated[bool, typer.Option("--egraph-fusion", help="Let the e-graph propose the program (fusions, recomputations, sibling kernels the scheduler does not make) and the search pick among them by measurement.")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Per distinct kernel: rules fired, alternatives tried with their times; the e-graph's size and the cost model's rank correlation.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Compile a training run (--run) or registered model (--model) into fused C or CUDA kernels.

    Traces the inference forward into primitive ops, fuses them into kernels, plans buffers by
    liveness, builds one shared library (kernel cache under the workspace's kernels/ folder),
    checks its outputs against PyTorch on random inputs and, only if they match, stores the plan
    as artifacts compile/TARGET of the training run, where `lumos infer --engine compiled` finds it.
    """
    from lumos.compile.engine import check_target, compile_run
    from lumos.compile.engine import clear_cache as clear
    from lumos.core.runs import resolve_run

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
    subject = resolve_run(workspace, run, model)
    with progress(f"compiling {subject.label} for {target}") as report:
        summary = compile_run(workspace, subject.run_id, target, seq_len=seq, report=report,
                              **given(batch_size=batch, search_budget_s=0.0 if no_search else search_budget,
                                      egraph_fusion=egraph_fusion or None))
    stats = summary.stats
    if json_output:
        fields = renamed(json_data(summary), batch_size="batch", seq_len="seq")
        emit_json({**fields.pop("stats"), **fields, "model": subject.version.label if subject.version else None})
        return
    speedup = summary.eager_ms / summary.compiled_ms if summary.compiled_ms else float("nan")
    rows = [
        ("primitive ops in", f"{stats['primitive_ops']:,}"),
        ("kernels out", f"{stats['kernels']:,}"),
        ("fused ops", f"{stats['fused_ops']:,}"),
        ("linear layers on one input", f"{stats.get('matmuls_merged', 0)} matmul(s) merged into wider ones"),
        ("planned peak memory", f"{_bytes(stats['planned_peak_bytes'])} (one buffer per node: {_bytes(stats['per_node_bytes'])})"),
        ("time per forward", f"{summary.compiled_ms:.2f} ms compiled vs {summary.eager_ms:.2f} ms torch eager ({speedup:.2f}x)"),
        ("max difference vs torch", f"{summary.max_error:.2e}"),
        ("kernel cache", "hit" if summary.cache_hit else f"built in {summary.seconds.get('build', 0):.1f} s"),
        ("schedule search", _search_line(summary)),
        ("fused attention", _attention_line(summary.attention) if summary.target != "cuda" else
         f"{stats.get('attention_kernels', 0)} online-softmax kernel(s), one warp per query"),
        ("e-graph", _egraph_line(summary.egraph)),
        ("fusion choices", _fusion_line(summary.fusion)),
        ("plan", f"{summary.artifact} of run {summary.run_id}"),
    ]
    print_table(f"{subject.label} → {target}, batch {summary.batch_size}, sequence {summary.seq_len}", ["", ""], rows)
    if explain and summary.programs:
        for line in program_lines(summary.programs):
            echo(line)
    if explain and summary.search:
        echo(f"cost model: {_cost_model_line(summary.cost_model)}")
        if summary.fusion and summary.fusion["steps"]:
            echo("fusion steps (whole call, stored vs fused):")
            for step in summary.fusion["steps"]:
                echo(_fusion_step(step))
        print_table("schedule search, per distinct kernel (times: median ms per call, summed over its copies)",
                    ["kernels", "kind", "shape", "rules fired", "tried", "baseline", "best", "worst",
                     "alternatives tried (ms)"],
                    [_explain_row(group) for group in summary.search])
