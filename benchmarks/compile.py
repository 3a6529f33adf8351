"""Forward time of the Lumos model at batch 256: torch eager, torch.compile (inductor), Lumos compiled.

    python benchmarks/compile.py [--batch 256] [--repeats 10] [--skip-inductor] [--search-budget 120]
                                 [--egraph-fusion]
                                 [--attention-seq 512] [--out benchmarks/results/compile.json]
                                 [--models quickstart sasrec transformer_encoder ... | all]

Two models: the quickstart model (lumos/quickstart/train.toml's [model], feature sizes as the
quickstart data gives them) and a SASRec-sized one (width 64, 2 heads, 2 layers, sequence 50,
about 1,700 items). Random weights and inputs; inference mode; medians over --repeats calls after a
warm-up, taken round-robin so that every engine sees the same background load. Also reports the Lumos compile time with a cold and a warm kernel cache, its planned
peak memory against one buffer per node, and its largest difference from eager.

GFLOP/s counts the matrix products (2·M·N·K each, from the primitive graph), which dominate.
The machine's FMA peak is measured first (benchmarks/fma_peak.py, every torch thread), and the
Lumos models' kernels that hold matrix products, timed one by one, are reported against it.
Lumos runs with its schedule search (cold: empty caches; warm: the same compile again, which
reuses the search cache and the kernel cache), with the search but without its register-blocked
matmul candidates (`lumos_unblocked`: what the search found before them, timed in the same
rounds as the rest), without horizontal fusion (`lumos_unmerged`: each linear layer its own
matmul, searched) and without search (`lumos_no_search`); the JSON keeps the per-kernel profile
of the searched forward (and of the unblocked one) and what the search chose per kernel. Last, one
attention at sequence 512: torch eager (SDPA and the explicit softmax) against Lumos with the
fused online-softmax kernel, time and extra peak memory.

`--models` also takes modules no one here wrote, compiled through the general frontend
(`lumos.compile.compile_module`), at width 64, 2 heads, sequence 50, batch --batch:
`transformer_encoder` and `transformer_encoder_norm_first` (nn.TransformerEncoder, 2 layers,
feed-forward 256, batch_first, a key padding mask), `multihead_attention` (nn.MultiheadAttention
self-attention with a key padding mask), `mlp` (Linear 64→256, LayerNorm, GELU, Linear 256→64 over
every position) and `sasrec_baseline` (benchmarks/sasrec.py's SASRec, 2 layers, 1,702 items).
Also `bert` and `gpt2` (Hugging Face's BertModel and GPT2LMHeadModel built from a config, random
weights: hidden 256, 4 layers, 4 heads, sequence 128, vocabulary 1,000, right-padded attention
masks; timed on the last hidden state and on the logits without a KV cache), `resnet` (a
ResNet-style network: width 64, two stages of residual blocks, 64×64 images) and `dlrm` (a
DLRM-style ranking model: 8 EmbeddingBag tables of 10 to 10,000 rows with runtime offsets, bags of
1 to 4 ids, 13 dense features, width 64), from benchmarks/brought_models.py at its BENCH size, with
a batch of 32 (or --batch if smaller). The JSON lists the ops each ran in eager (`eager_ops`, none
for these four: every op compiles).

`--egraph-fusion` compiles every Lumos variant with Options.egraph_fusion (the e-graph proposes
the program, search/genome.py climbs over its proposals within a quarter of the budget) and writes
benchmarks/results/compile_egraph_fusion.json by default, so the two modes are timed by two runs
of this script, each alone; the JSON keeps what the e-graph proposed and kept (`programs`).
Eager runs as a user gets it (eval mode, no grad, PyTorch's fused transformer fast path allowed);
Lumos compiles the math path, and its largest difference is taken against eager's math path
(the fast path writes zeros at padded positions). The default runs the two Lumos models only.

OpenMP's idle threads sleep (`OMP_WAIT_POLICY=PASSIVE`, unless the environment sets it): torch and
the Lumos library each have an OpenMP pool, and with the default policy one engine's threads still
spin on both cores while the next engine's call, timed round-robin right after, runs. On the
SASRec-size model, one run each way: eager 27.1 / inductor 23.6 / Lumos 21.8 ms spinning, 24.0 /
21.2 / 16.4 ms passive. Whole runs drift by more than that on this VM (two later passive runs: 32.4
/ 29.9 / 21.8 and 24.5 / 22.7 / 17.6 ms), so the gain is not pinned down; passive is kept because
no engine should be timed beside another's idle threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when OpenMP loads, so before torch (see above)

import brought_models
import fma_peak
import numpy as np
import torch

from lumos.compile.engine import SEARCH_BUDGET_S, compile_model, median_ms, verify
from lumos.compile.frontend.export import CompiledModule, compile_module, verify_module
from lumos.compile.frontend.lumos_model import _Forward, batch_tensors, input_names
from lumos.compile.ir.graph import Graph, is_matmul
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.core.config import load_config
from lumos.data.contract import FeatureSpec
from lumos.quickstart import RECIPES
from lumos.train.config import TrainConfig
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelConfig

ROOT = Path(__file__).resolve().parent.parent

QUICKSTART_FEATURES = FeatureSpec(
    token_categorical={"item": 502, "event_type": 6, "cat_device": 5, "cat_category": 10, "hour": 24, "weekday": 7,
                       "gap_bucket": 16},
    token_numeric=("value", "age_days"),
    static_categorical={"user_country": 8, "user_age_bucket": 7},
    static_numeric=("user_tenure_days",),
    future_flags=("holiday", "sale"),
    horizons_days=(7,),
    max_len=100,
)
LUMOS_MODELS = ("quickstart", "sasrec")
SASREC_FEATURES = FeatureSpec(token_categorical={"item": 1702}, token_numeric=(), max_len=50)
SASREC_CONFIG = ModelConfig(d_model=64, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=64, dropout=0.0,
                            max_len=50, heads=("retrieval",))


def matmul_flops(graph: Graph) -> int:
    """2·M·N·K over every sum of a product (the matrix products of the graph)."""
    return sum(2 * node.views[0].shape[node.arg] * node.size for node in graph.nodes if is_matmul(node))


def bench_model(name: str, model: LumosModel, batch_size: int, repeats: int, inductor: bool,
                search_budget: float = SEARCH_BUDGET_S, egraph_fusion: bool = False) -> dict:
    model.eval()
    seq_len = model.features.max_len
    batch = synthetic_batch(model.features, batch_size, seq_len, seed=3)
    result = {"model": name, "batch": batch_size, "seq": seq_len, "parameters": model.num_parameters()}
    print(f"== {name}: batch {batch_size}, sequence {seq_len}, {model.num_parameters():,} parameters", flush=True)

    engines = {"eager": lambda: model(batch)}
    if inductor:
        wrapper = _Forward(model)
        named = batch_tensors(batch, model.features)
        args = [named[key] for key in input_names(model.features)]
        compiled = torch.compile(wrapper)
        started = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        result["inductor_compile_s"] = time.perf_counter() - started
        engines["inductor"] = lambda: compiled(*args)

    with tempfile.TemporaryDirectory(prefix="lumos-bench-kernels-") as folder:
        cache = KernelCache(folder, "cpu")
        mode = Options(egraph_fusion=egraph_fusion)
        options = replace(mode, search_budget_s=search_budget)
        unsearched = compile_model(model, batch_size, seq_len, cache, mode)
        cold = compile_model(model, batch_size, seq_len, cache, options)
        warm = compile_model(model, batch_size, seq_len, cache, options)
        assert warm.compilation.build.hit and (warm.compilation.search is None or warm.compilation.search.cache_hit)
        unblocked = compile_model(model, batch_size, seq_len, cache,
                                  replace(options, search_cache=False, register_blocks=False))
        result["max_error"] = verify(cold, model, seeds=(1,))
        engines["lumos"] = lambda: cold.compiled(batch)
        unmerged = compile_model(model, batch_size, seq_len, cache, replace(options, fuse_linear_layers=False))
        engines["lumos_unblocked"] = lambda: unblocked.compiled(batch)
        engines["lumos_unmerged"] = lambda: unmerged.compiled(batch)
        engines["lumos_no_search"] = lambda: unsearched.compiled(batch)
        # Round-robin: on a shared machine every engine sees the same background load.
        with torch.no_grad():
            times = {engine: [] for engine in engines}
            for call in engines.values():  # warm-up
                call()
                call()
            for _ in range(repeats):
                for engine, call in engines.items():
                    times[engine].append(median_ms(call, 1, warmup=0))
        result["load_average"] = os.getloadavg()  # right after the timed calls: comparable only at a like load
        for engine, values in times.items():
            result[f"{engine}_ms"] = statistics.median(values)
            result[f"{engine}_best_ms"] = min(values)  # least disturbed by other load
        stats = cold.compilation.stats()
    if cold.compilation.programs is not None:  # --egraph-fusion: what the e-graph proposed, timed and kept
        result["programs"] = cold.compilation.programs
    search = cold.compilation.search
    if search is not None:
        result["search_s"] = search.seconds
        result["search_rounds"] = search.rounds
        result["search_attention"] = search.attention
        result["search_confirmed"] = search.confirmed
        result["search_kernels"] = search.report()
        result["kernel_ms"] = _kernel_profile(cold, batch)
        products = [row for row in result["kernel_ms"] if row["gflops"] > 0]  # kernels holding matrix products
        # All of them, then split by kind: fused attention (softmax between its two products) and
        # the rest (linear layers, with their fused prologues and epilogues), each at its own rate.
        for kind, rows in (("matmul", products),
                           ("attention", [r for r in products if r["kind"] == "attention"]),
                           ("linear", [r for r in products if r["kind"] != "attention"])):
            ms = sum(row["ms"] for row in rows)
            result[f"{kind}_kernel_ms"] = ms
            result[f"{kind}_kernel_gflops"] = sum(row["gflops"] * row["ms"] for row in rows) / ms if ms else None
        result["unblocked_kernel_ms"] = _kernel_profile(unblocked, batch)
    print(f"  load average     {', '.join(f'{x:.2f}' for x in result['load_average'])} (1, 5, 15 min) after the timed calls")
    print(f"  torch eager      {result['eager_ms']:8.2f} ms", flush=True)
    if inductor:
        print(f"  torch.compile    {result['inductor_ms']:8.2f} ms  (compiled in {result['inductor_compile_s']:.0f} s)")
    result.update({
        "lumos_compile_cold_s": cold.seconds["total"], "lumos_compile_warm_s": warm.seconds["total"],
        "lumos_build_cold_s": cold.seconds["build"], "lumos_build_warm_s": warm.seconds["build"],
        "lumos_trace_s": cold.seconds["trace"], **stats,
    })
    flops = matmul_flops(cold.compilation.graph)
    result["matmul_gflop"] = flops / 1e9
    for engine in ("eager", "inductor", "lumos"):
        if f"{engine}_ms" in result:
            result[f"{engine}_gflops"] = flops / (result[f"{engine}_ms"] / 1000) / 1e9
    result["lumos_vs_eager"] = result["eager_ms"] / result["lumos_ms"]
    if "inductor_ms" in result:
        result["lumos_vs_inductor"] = result["inductor_ms"] / result["lumos_ms"]
    print(f"  lumos, no search {result['lumos_no_search_ms']:8.2f} ms")
    print(f"  lumos, unblocked {result['lumos_unblocked_ms']:8.2f} ms  (searched without the register-blocked matmul)")
    print(f"  lumos, unmerged  {result['lumos_unmerged_ms']:8.2f} ms  (searched, each linear layer its own matmul)")
    print(f"  lumos compiled   {result['lumos_ms']:8.2f} ms  ({result['lumos_vs_eager']:.2f}x eager"
          + (f", {result['lumos_vs_inductor']:.2f}x inductor" if "inductor_ms" in result else "") + ")")
    print("  best of runs     " + ", ".join(f"{engine} {result[f'{engine}_best_ms']:.2f} ms" for engine in engines))
    print(f"  matmul GFLOP/s   eager {result['eager_gflops']:.1f}"
          + (f", inductor {result['inductor_gflops']:.1f}" if "inductor_gflops" in result else "")
          + f", lumos {result['lumos_gflops']:.1f}  ({result['matmul_gflop']:.2f} GFLOP per forward)")
    print(f"  kernels {stats['kernels']} from {stats['primitive_ops']} primitive ops; planned peak "
          f"{stats['planned_peak_bytes'] / 2**20:.1f} MiB vs {stats['per_node_bytes'] / 2**20:.1f} MiB one buffer per node "
          f"({stats['unshared_bytes'] / 2**20:.1f} MiB without reuse)")
    if "kernel_ms" in result:
        top = ", ".join(f"{row['kernel']} {row['kind']} {row['ms']:.1f} ms" for row in result["kernel_ms"][:5])
        print(f"  slowest kernels  {top}")
        print(f"  matmul kernels   {result['matmul_kernel_gflops']:.1f} GFLOP/s over {result['matmul_kernel_ms']:.1f} ms "
              "(the kernels that hold matrix products, timed one by one)")
        print("                   " + "; ".join(
            f"{kind} {result[f'{kind}_kernel_gflops']:.1f} GFLOP/s over {result[f'{kind}_kernel_ms']:.1f} ms"
            for kind in ("linear", "attention") if result[f"{kind}_kernel_gflops"]))
        _print_attention(result.get("search_attention"))
    if result.get("search_confirmed"):
        confirmed = result["search_confirmed"]
        print(f"  search verdict   whole call {confirmed['searched_ms']:.1f} ms searched vs {confirmed['baseline_ms']:.1f} ms "
              f"unsearched: {'kept' if confirmed['kept'] else 'reverted to the defaults'}")
    print(f"  compile: cold {result['lumos_compile_cold_s']:.1f} s (search {result.get('search_s', 0):.1f} s, gcc {result['lumos_build_cold_s']:.1f} s), warm "
          f"{result['lumos_compile_warm_s']:.1f} s (cache hit, {result['lumos_build_warm_s'] * 1000:.0f} ms); "
          f"max |diff| vs eager {result['max_error']:.1e}", flush=True)
    return result


def _kernel_profile(result, batch, repeats: int = 5) -> list[dict]:
    """Median ms per kernel of the compiled forward (the driver's timed variant), slowest first."""
    from lumos.compile.frontend.lumos_model import batch_tensors as tensors_of
    from lumos.compile.search.climb import kernel_flops

    compiled, kernels = result.compiled, result.compilation.kernels
    named = {name: t.float().numpy() for name, t in tensors_of(batch, compiled.features).items()
             if name in compiled.program_inputs}
    samples = [compiled.program.kernel_seconds(named, len(kernels)) for _ in range(repeats + 1)][1:]
    medians = [statistics.median(values) * 1000 for values in zip(*samples, strict=True)]
    rows = [{"kernel": k.name, "kind": k.kind, "shape": list(k.node.shape), "ms": ms,
             "gflops": kernel_flops(k) / (ms / 1000) / 1e9 if ms > 0 else 0.0, "origin": k.node.origin[:60]}
            for k, ms in zip(kernels, medians, strict=True)]
    return sorted(rows, key=lambda row: -row["ms"])


def bench_attention(seq: int, batch: int, heads: int, head_dim: int, repeats: int, search_budget: float) -> dict:
    """One masked attention at sequence `seq`: torch eager (SDPA and the explicit softmax) against
    Lumos with and without the fused online-softmax kernel; time and the extra memory of one call."""
    import subprocess
    import sys

    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, attention, mark_output

    print(f"== attention: batch {batch}, {heads} heads, sequence {seq}, head size {head_dim}", flush=True)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, generator=generator) for _ in range(3))
    mask = (torch.rand(batch, 1, 1, seq, generator=generator) > 0.2).float()
    mask[..., 0] = 1.0

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask > 0)

    def explicit():
        scores = (q @ k.transpose(-1, -2)) / head_dim ** 0.5
        return torch.softmax(scores.masked_fill(mask == 0, -1e30), -1) @ v

    def attention_graph() -> Graph:
        # The keys stored along the sequence, (B, H, D, T), as the layout pass stores them in the
        # model (a projection's output copied once). A bare input read as (B, H, T, D) would make
        # every key load a strided gather, which no compiled model does.
        graph = Graph()
        tq, tv = (Tensor.input(graph, name, (batch, heads, seq, head_dim)) for name in "qv")
        tk = Tensor.input(graph, "k_by_key", (batch, heads, head_dim, seq)).transpose(2, 3)
        tmask = Tensor.input(graph, "mask", (batch, 1, 1, seq))
        mark_output(graph, "y", attention(tq, tk, tv, tmask))
        return graph.prune()

    named = {"q": q.numpy(), "k_by_key": k.transpose(-1, -2).contiguous().numpy(), "v": v.numpy(), "mask": mask.numpy()}
    result = {"seq": seq, "batch": batch, "heads": heads, "head_dim": head_dim,
              "score_matrix_bytes": batch * heads * seq * seq * 4}
    with tempfile.TemporaryDirectory(prefix="lumos-bench-attention-") as folder:
        cache = KernelCache(folder, "cpu")
        plain = compile_graph(attention_graph(), cache, Options())
        started = time.perf_counter()
        searched = compile_graph(attention_graph(), cache, Options(search_budget_s=search_budget, search_cache=False), named)
        result["search_s"] = time.perf_counter() - started
        result["search_attention"] = searched.search.attention
        programs = {"lumos_unfused": load_program(plain), "lumos_searched": load_program(searched)}
        fused_chosen = bool(searched.search.attention and searched.search.attention["chosen"])
        want = explicit().numpy()
        for name, program in programs.items():
            got = program(named)["y"].reshape(want.shape)
            result[f"{name}_max_error"] = float(np.max(np.abs(got - want)))
        engines = {"eager_sdpa": sdpa, "eager_explicit": explicit,
                   **{name: (lambda p=program: p(named)) for name, program in programs.items()}}
        times = {name: [] for name in engines}
        with torch.no_grad():
            for call in engines.values():
                call()
            for _ in range(repeats):
                for name, call in engines.items():
                    times[name].append(median_ms(call, 1, warmup=0))
        for name, values in times.items():
            result[f"{name}_ms"] = statistics.median(values)
        result["lumos_unfused_arena_bytes"] = plain.buffers.arena_bytes
        result["lumos_searched_arena_bytes"] = searched.buffers.arena_bytes
        result["fused_chosen"] = fused_chosen
    # Extra peak memory of one eager call, in a fresh process: the peak RSS (VmHWM, reset through
    # /proc/self/clear_refs just before the call) above the RSS before it.
    for name in ("sdpa", "explicit"):
        code = (f"import re, torch; g = torch.Generator().manual_seed(0); "
                f"q, k, v = (torch.randn({batch}, {heads}, {seq}, {head_dim}, generator=g) for _ in range(3)); "
                f"mask = torch.rand({batch}, 1, 1, {seq}, generator=g) > 0.2; "
                "status = lambda key: int(re.search(key + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024; "
                "open('/proc/self/clear_refs', 'w').write('5'); before = status('VmRSS'); "
                + ("y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask); " if name == "sdpa" else
                   f"y = torch.softmax(((q @ k.transpose(-1, -2)) / {head_dim ** 0.5}).masked_fill(~mask, -1e30), -1) @ v; ")
                + "print(status('VmHWM') - before)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        result[f"eager_{name}_peak_extra_bytes"] = int(out.stdout.strip().splitlines()[-1])
    mib = 2 ** 20
    print(f"  torch eager SDPA      {result['eager_sdpa_ms']:8.2f} ms, peak +{result['eager_sdpa_peak_extra_bytes'] / mib:.1f} MiB")
    print(f"  torch eager explicit  {result['eager_explicit_ms']:8.2f} ms, peak +{result['eager_explicit_peak_extra_bytes'] / mib:.1f} MiB")
    print(f"  lumos, no search      {result['lumos_unfused_ms']:8.2f} ms, arena {result['lumos_unfused_arena_bytes'] / mib:.1f} MiB")
    print(f"  lumos, searched       {result['lumos_searched_ms']:8.2f} ms, arena {result['lumos_searched_arena_bytes'] / mib:.1f} MiB"
          f" (fused online softmax {'chosen' if result['fused_chosen'] else 'not chosen'}; score matrix would be "
          f"{result['score_matrix_bytes'] / mib:.1f} MiB)", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Modules no one here wrote, through the general frontend

WIDTH, HEADS, SEQ = 64, 2, 50
SASREC_ITEMS = 1702


def _load_sasrec_benchmark():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("sasrec_benchmark", ROOT / "benchmarks" / "sasrec.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sasrec_benchmark"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


class _Encoder(torch.nn.Module):
    def __init__(self, norm_first: bool):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.1, batch_first=True,
                                                 norm_first=norm_first)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first)

    def forward(self, x, padding):
        return self.encoder(x, src_key_padding_mask=padding)


class _SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)

    def forward(self, x, padding):
        return self.attention(x, x, x, key_padding_mask=padding)


def brought_model(name: str, batch_size: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """One of BROUGHT_MODELS at brought_models.BENCH's size (its batch, or batch_size if smaller),
    and its inputs; the Hugging Face models as their main output tensor."""
    size = replace(brought_models.BENCH, batch=min(batch_size, brought_models.BENCH.batch))
    build, inputs = brought_models.MODELS[name]
    module = build(size)
    if name == "bert":
        module = brought_models.Transformer(module, "last_hidden_state")
    elif name == "gpt2":
        module.config.use_cache = False  # one forward over the sequence, as scoring it: no KV cache to return
        module = brought_models.Transformer(module, "logits")
    return module, inputs(size, 3)


def external_model(name: str, batch_size: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """One of EXTERNAL_MODELS with seeded weights, and its inputs at (batch_size, SEQ)."""
    if name in BROUGHT_MODELS:
        return brought_model(name, batch_size)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(batch_size, SEQ, WIDTH, generator=generator)
    lengths = torch.randint(SEQ // 4, SEQ + 1, (batch_size,), generator=generator)
    padding = torch.arange(SEQ)[None, :] >= lengths[:, None]  # True = padded, never a whole row
    if name.startswith("transformer_encoder"):
        return _Encoder(norm_first=name.endswith("norm_first")), (x, padding)
    if name == "multihead_attention":
        return _SelfAttention(), (x, padding)
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.LayerNorm(4 * WIDTH), torch.nn.GELU(),
                                   torch.nn.Linear(4 * WIDTH, WIDTH)), (x,)
    sasrec = _load_sasrec_benchmark()
    model = sasrec.SASRec(sasrec.SASRecConfig(d_model=WIDTH, n_heads=HEADS, layers=2), SASREC_ITEMS, SEQ)
    ids = torch.randint(1, SASREC_ITEMS, (batch_size, SEQ), generator=generator)
    ids[padding.flip(1)] = 0  # left-padded histories, as SASRec reads them
    return model, (ids,)


BROUGHT_MODELS = ("bert", "gpt2", "resnet", "dlrm")
EXTERNAL_MODELS = ("transformer_encoder", "transformer_encoder_norm_first", "multihead_attention", "mlp",
                   "sasrec_baseline", *BROUGHT_MODELS)


def bench_external(name: str, batch_size: int, repeats: int, inductor: bool, search_budget: float,
                   egraph_fusion: bool = False) -> dict:
    """eager, torch.compile (inductor) and Lumos (searched and not) on one external module."""
    module, inputs = external_model(name, batch_size)
    module.eval()
    parameters = sum(p.numel() for p in module.parameters())
    shapes = [list(value.shape) for value in inputs]
    result = {"model": name, "batch": inputs[0].shape[0], "inputs": shapes, "parameters": parameters}
    if name not in BROUGHT_MODELS:
        result["seq"] = SEQ
    print(f"== {name}: inputs {', '.join('x'.join(map(str, shape)) for shape in shapes)}, {parameters:,} parameters",
          flush=True)
    engines = {"eager": lambda: module(*inputs)}
    if inductor:
        compiled = torch.compile(module)
        started = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs)
        result["inductor_compile_s"] = time.perf_counter() - started
        engines["inductor"] = lambda: compiled(*inputs)
    with tempfile.TemporaryDirectory(prefix="lumos-bench-kernels-") as folder:
        cache = KernelCache(folder, "cpu")
        mode = Options(egraph_fusion=egraph_fusion)
        started = time.perf_counter()
        unsearched = compile_module(module, inputs, cache, mode, search_budget=0)
        result["lumos_compile_no_search_s"] = time.perf_counter() - started
        started = time.perf_counter()
        searched = compile_module(module, inputs, cache, mode, search_budget=search_budget)
        result["lumos_compile_cold_s"] = time.perf_counter() - started
        started = time.perf_counter()
        compile_module(module, inputs, cache, mode, search_budget=search_budget)
        result["lumos_compile_warm_s"] = time.perf_counter() - started
        second = tuple(_fresh_like(value) for value in inputs)
        # A partitioned module's partitions were each checked against eager when compiled.
        result["max_error"] = (verify_module(searched, module, [inputs, second]) if isinstance(searched, CompiledModule)
                               else searched.max_error)
        engines["lumos"] = lambda: searched(*inputs)
        engines["lumos_no_search"] = lambda: unsearched(*inputs)
        with torch.no_grad():
            times = {engine: [] for engine in engines}
            for call in engines.values():  # warm-up
                call()
                call()
            for _ in range(repeats):  # round-robin, as bench_model
                for engine, call in engines.items():
                    times[engine].append(median_ms(call, 1, warmup=0))
        result["load_average"] = os.getloadavg()
        if isinstance(searched, CompiledModule):
            compilations, stats = [searched.compilation], searched.compilation.stats()
            result["eager_ops"] = []
        else:  # ops left to eager (partition.py): timed whole, its kernels counted over the partitions
            compilations = [part.compilation for part in searched.partitions]
            stats = {key: sum(c.stats()[key] for c in compilations) for key in ("kernels", "primitive_ops")}
            result["eager_ops"] = searched.eager_ops
        flops = sum(matmul_flops(c.graph) for c in compilations)
        if isinstance(searched, CompiledModule) and searched.compilation.search is not None:
            result["search_attention"] = searched.compilation.search.attention
    for engine, values in times.items():
        result[f"{engine}_ms"] = statistics.median(values)
        result[f"{engine}_best_ms"] = min(values)
    result.update(stats)
    result["matmul_gflop"] = flops / 1e9
    result["lumos_vs_eager"] = result["eager_ms"] / result["lumos_ms"]
    if inductor:
        result["lumos_vs_inductor"] = result["inductor_ms"] / result["lumos_ms"]
    print(f"  load average     {', '.join(f'{x:.2f}' for x in result['load_average'])} (1, 5, 15 min) after the timed calls")
    print(f"  torch eager      {result['eager_ms']:8.2f} ms", flush=True)
    if inductor:
        print(f"  torch.compile    {result['inductor_ms']:8.2f} ms  (compiled in {result['inductor_compile_s']:.0f} s)")
    print(f"  lumos, no search {result['lumos_no_search_ms']:8.2f} ms")
    print(f"  lumos compiled   {result['lumos_ms']:8.2f} ms  ({result['lumos_vs_eager']:.2f}x eager"
          + (f", {result['lumos_vs_inductor']:.2f}x inductor" if inductor else "") + ")")
    print(f"  kernels {stats['kernels']} from {stats['primitive_ops']} primitive ops; compile: no search "
          f"{result['lumos_compile_no_search_s']:.1f} s, cold {result['lumos_compile_cold_s']:.1f} s, warm "
          f"{result['lumos_compile_warm_s']:.1f} s; max |diff| vs eager (math path) {result['max_error']:.1e}", flush=True)
    print(f"  in eager         {', '.join(result['eager_ops']) or 'nothing (every op compiled)'}")
    _print_attention(result.get("search_attention"))
    return result


def _print_attention(attention: dict | None) -> None:
    """The search's attention choices: fused or not, and the keys staged or through their copies."""
    if not attention:
        return
    print(f"  fused attention  {attention['matches']} found, {'kept' if attention['chosen'] else 'not kept'} "
          f"({attention['fused_ms'] or float('nan'):.1f} ms vs {attention['unfused_ms'] or float('nan'):.1f} ms "
          "unfused, whole call, both searched)")
    staged = attention.get("staged_keys")
    if staged and staged["verified"]:
        print(f"  staged keys      {'kept' if staged['chosen'] else 'not kept'} ({staged['staged_ms']:.1f} ms vs "
              f"{staged['copies_ms']:.1f} ms with the keys' transposed copies, whole call)")


def _fresh_like(value: torch.Tensor) -> torch.Tensor:
    """Other inputs of the same kind: new features, the same masks and ids (valid by construction)."""
    if value.is_floating_point():
        return torch.randn(value.shape, generator=torch.Generator().manual_seed(11))
    return value



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--skip-inductor", action="store_true", help="Leave out torch.compile (slow to build).")
    parser.add_argument("--search-budget", type=float, default=SEARCH_BUDGET_S, help="Lumos schedule search, seconds per model.")
    parser.add_argument("--egraph-fusion", action="store_true",
                        help="Let the e-graph propose the program (Options.egraph_fusion); time it alone, apart from a default run.")
    parser.add_argument("--attention-seq", type=int, default=512, help="Sequence length of the attention benchmark (0: skip).")
    parser.add_argument("--out", type=Path, default=None, help="Default: benchmarks/results/compile.json (compile_cuda.json for cuda).")
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: eager vs torch.compile vs Lumos CUDA on the GPU, and attention at 512 and 2048 vs SDPA (compile_cuda.py).")
    parser.add_argument("--models", nargs="+", default=list(LUMOS_MODELS), choices=[*LUMOS_MODELS, *EXTERNAL_MODELS, "all"],
                        help="Lumos models and modules no one here wrote (see the module docstring); all: every one.")
    args = parser.parse_args()
    default_out = "compile_egraph_fusion.json" if args.egraph_fusion else "compile.json"
    args.out = args.out or ROOT / "benchmarks" / "results" / (default_out if args.target == "cpu" else "compile_cuda.json")
    chosen = [*LUMOS_MODELS, *EXTERNAL_MODELS] if "all" in args.models else args.models
    peak = fma_peak.measure(torch.get_num_threads(), seconds=0.5) if args.target == "cpu" else None

    torch.manual_seed(0)
    train = load_config(TrainConfig, RECIPES / "train.toml")
    models = [
        ("quickstart", LumosModel(train.model, QUICKSTART_FEATURES)),
        ("sasrec", LumosModel(SASREC_CONFIG, SASREC_FEATURES)),
    ]
    if args.target == "cuda":
        from compile_cuda import main as bench_cuda

        report = bench_cuda(models, args.batch, args.repeats, not args.skip_inductor)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
        return
    results = [bench_model(name, model, args.batch, args.repeats, not args.skip_inductor, args.search_budget,
                           args.egraph_fusion)
               for name, model in models if name in chosen]
    results += [bench_external(name, args.batch, args.repeats, not args.skip_inductor, args.search_budget,
                               args.egraph_fusion)
                for name in EXTERNAL_MODELS if name in chosen]
    report = {"egraph_fusion": args.egraph_fusion, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
                          "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], "fma_peak": peak},
              "results": results}
    print(f"FMA peak {peak['peak_gflops']:.1f} GFLOP/s ({peak['threads']} threads, benchmarks/fma_peak.py); matmul kernels: "
          + ", ".join(f"{r['model']} {r['matmul_kernel_gflops'] / peak['peak_gflops']:.0%}"
                      + (f" (linear layers {r['linear_kernel_gflops'] / peak['peak_gflops']:.0%})" if r["linear_kernel_gflops"] else "")
                      for r in results if "matmul_kernel_gflops" in r))
    if args.attention_seq:
        report["attention"] = bench_attention(args.attention_seq, 16, 2, 32, args.repeats, args.search_budget)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
