"""Forward time on one GPU at batch 256: torch eager, torch.compile (inductor), Lumos CUDA; and one
attention at sequences 512 and 2048 against SDPA. Run by `benchmarks/compile.py --target cuda`
(and so by benchmarks/gpu_check.sh); exits 1 at once without a CUDA GPU.

Both models of benchmarks/compile.py, random weights, fp32 (the precision the compiled plan is
verified in), inference mode. Times are medians of CUDA-event measurements over --repeats calls
taken round-robin; Lumos is one CUDA-graph replay per call, eager and inductor run as they are.
Not yet run on a GPU.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from lumos.compile.engine import compile_model, verify
from lumos.compile.frontend.lumos_model import _Forward, batch_tensors, input_names
from lumos.compile.ir.graph import Graph
from lumos.compile.ir.hl_ops import Tensor, attention, mark_output
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.runtime.cuda import gpu_arch
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import CUDA
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel


def event_ms(call) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def round_robin(engines: dict, repeats: int) -> dict[str, float]:
    times = {name: [] for name in engines}
    with torch.no_grad():
        for call in engines.values():  # warm-up (and CUDA-graph capture)
            call()
            call()
        for _ in range(repeats):
            for name, call in engines.items():
                times[name].append(event_ms(call))
    return {name: statistics.median(values) for name, values in times.items()}


def bench_model_cuda(name: str, model: LumosModel, batch_size: int, repeats: int, inductor: bool) -> dict:
    model = model.cuda().eval()
    seq_len = model.features.max_len
    batch = synthetic_batch(model.features, batch_size, seq_len, seed=3).to("cuda")
    result = {"model": name, "batch": batch_size, "seq": seq_len, "arch": gpu_arch(), "gpu": torch.cuda.get_device_name()}
    print(f"== {name} on {result['gpu']} ({result['arch']}): batch {batch_size}, sequence {seq_len}", flush=True)
    engines = {"eager": lambda: model(batch)}
    named = batch_tensors(batch, model.features)
    if inductor:
        compiled = torch.compile(_Forward(model))
        args = [named[key] for key in input_names(model.features)]
        started = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        result["inductor_compile_s"] = time.perf_counter() - started
        engines["inductor"] = lambda: compiled(*args)
    with tempfile.TemporaryDirectory(prefix="lumos-bench-cuda-") as folder:
        started = time.perf_counter()
        lumos = compile_model(model.cpu(), batch_size, seq_len, KernelCache(folder, "cuda"), target=CUDA)
        result["lumos_compile_s"] = time.perf_counter() - started
        model.cuda()
        result["max_error"] = verify(lumos, model, seeds=(1,))
        graph = lumos.compilation.graph
        inputs = {key: value.to("cuda", torch.float32) for key, value in named.items() if key in graph.inputs}
        engines["lumos"] = lambda: lumos.compiled.program(inputs)
        result.update({f"{engine}_ms": ms for engine, ms in round_robin(engines, repeats).items()})
        result.update(lumos.compilation.stats())
    result["lumos_vs_eager"] = result["eager_ms"] / result["lumos_ms"]
    line = f"  eager {result['eager_ms']:.3f} ms"
    if inductor:
        result["lumos_vs_inductor"] = result["inductor_ms"] / result["lumos_ms"]
        line += f", torch.compile {result['inductor_ms']:.3f} ms"
    print(line + f", Lumos CUDA {result['lumos_ms']:.3f} ms ({result['lumos_vs_eager']:.2f}x eager"
          + (f", {result['lumos_vs_inductor']:.2f}x inductor" if inductor else "") + f"); max |diff| {result['max_error']:.1e}",
          flush=True)
    return result


def bench_attention_cuda(seq: int, batch: int = 16, heads: int = 2, width: int = 32, repeats: int = 20) -> dict:
    graph = Graph()
    q, k, v = (Tensor.input(graph, name, (batch, heads, seq, width)) for name in "qkv")
    mark_output(graph, "out", attention(q, k, v, Tensor.input(graph, "mask", (batch, 1, 1, seq))))
    graph.prune()
    with tempfile.TemporaryDirectory(prefix="lumos-bench-cuda-") as folder:
        compilation = compile_graph(graph, KernelCache(folder, "cuda"), Options(arch=gpu_arch()), target=CUDA)
        program = load_program(compilation)
    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(batch, heads, seq, width, generator=generator).cuda() for name in "qkv"}
    inputs["mask"] = (torch.rand(batch, 1, 1, seq, generator=generator) < 0.9).float().cuda()
    inputs["mask"][..., 0] = 1.0
    bool_mask = inputs["mask"].bool()
    engines = {"sdpa": lambda: F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], attn_mask=bool_mask),
               "lumos": lambda: program(inputs)}
    times = round_robin(engines, repeats)
    error = (program(inputs)["out"].reshape(batch, heads, seq, width) - engines["sdpa"]()).abs().max().item()
    result = {"seq": seq, "batch": batch, "heads": heads, "head_dim": width, "sdpa_ms": times["sdpa"],
              "lumos_ms": times["lumos"], "lumos_vs_sdpa": times["sdpa"] / times["lumos"], "max_error": error,
              "fused_kernels": compilation.attention, "arena_bytes": compilation.buffers.arena_bytes,
              "score_matrix_bytes": batch * heads * seq * seq * 4}
    print(f"== attention, sequence {seq}: SDPA {times['sdpa']:.3f} ms, Lumos fused {times['lumos']:.3f} ms "
          f"({result['lumos_vs_sdpa']:.2f}x); max |diff| {error:.1e}; arena {result['arena_bytes'] / 2**20:.1f} MiB "
          f"(a score matrix would be {result['score_matrix_bytes'] / 2**20:.0f} MiB)", flush=True)
    return result


def main(models: list[tuple[str, LumosModel]], batch_size: int, repeats: int, inductor: bool,
         attention_seqs: tuple[int, ...] = (512, 2048)) -> dict:
    if not torch.cuda.is_available():
        sys.exit("compile.py --target cuda: no CUDA GPU visible to torch (lumos doctor shows what it finds)")
    return {"target": "cuda", "results": [bench_model_cuda(name, model, batch_size, repeats, inductor) for name, model in models],
            "attention": [bench_attention_cuda(seq, repeats=repeats) for seq in attention_seqs]}
