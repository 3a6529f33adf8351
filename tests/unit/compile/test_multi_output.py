"""Kernels with several outputs (schedule/siblings.py): sibling row statistics, such as a layer
norm's mean and variance, computed by one kernel that writes each to its own buffer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lumos.compile.ir.graph import Graph, check_graph, mark_batch
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import Options, compile_graph, load_program

ON, OFF = Options(multi_output=True), Options(multi_output=False)


def _statistics_graph(rows: int, width: int) -> Graph:
    """A row's mean and variance (the variance reads the mean), and its sum and max (independent)."""
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, width))
    mark_output(graph, "mean", x.mean(-1, keepdim=True))
    mark_output(graph, "var", x.var(-1, keepdim=True))
    mark_output(graph, "sum", (x * 2.0).sum(-1, keepdim=True))
    mark_output(graph, "max", x.max(-1, keepdim=True))
    graph.prune()
    check_graph(graph)
    return graph


def _layer_norm_graph(rows: int, width: int, norms: int = 1) -> Graph:
    """`norms` layer norms in a chain, each over the last dim with its own weight and bias."""
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, width))
    for layer in range(norms):
        x = x.layer_norm(Tensor.input(graph, f"w{layer}", (width,)), Tensor.input(graph, f"b{layer}", (width,)), 1e-5)
    mark_output(graph, "y", x)
    graph.prune()
    check_graph(graph)
    return graph


def _inputs(graph: Graph, offset: float = 0.0, seed: int = 0) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    inputs = {name: generator.standard_normal(node.shape).astype(np.float32) for name, node in graph.inputs.items()}
    inputs["x"] += np.float32(offset)
    return inputs


@pytest.mark.parametrize("width", [3, 17, 783])
def test_joined_statistics_equal_the_interpreter(width, kernel_cache):
    graph = _statistics_graph(19, width)  # blocks of 8 rows: two whole, one of 3
    compilation = compile_graph(graph, kernel_cache, ON)
    assert any(kernel.also for kernel in compilation.kernels), "the row statistics were not joined"
    inputs = _inputs(graph, offset=3.0)
    got = load_program(compilation)(inputs)
    want = interpret(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("width", [3, 17, 783])
def test_layer_norm_matches_torch(width, offset, kernel_cache):
    """Against torch at 1e-4; rows with a large mean (1000 + randn) against torch in float64, at
    5e-4: float32's spacing at 1000 is 6e-5, times weights up to 3 (torch's own float32 layer norm
    is 1.2e-4 to 2.3e-4 from it there). A one-pass variance, E[x²] − E[x]², would be off by far
    more: x² ≈ 1e6 keeps about 0.06 of a variance of 1."""
    graph = _layer_norm_graph(7, width)
    compilation = compile_graph(graph, kernel_cache, ON)
    assert any(kernel.also for kernel in compilation.kernels)
    inputs = _inputs(graph, offset)
    got = load_program(compilation)(inputs)["y"].reshape(7, width)
    precision = torch.float64 if offset else torch.float32
    t = {name: torch.from_numpy(value).to(precision) for name, value in inputs.items()}
    want = F.layer_norm(t["x"], (width,), t["w0"], t["b0"], 1e-5).numpy()
    tolerance = 5e-4 if offset else 1e-4
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_layer_norms_take_fewer_kernels(kernel_cache):
    """One layer norm: its mean and variance in one kernel (3 kernels → 2, the normalizing one
    after them). Two in a chain: 6 → 4, the first one's mean and variance and the second one's mean
    (of the first one's output, computed inline from the same row) in one kernel."""
    one = _layer_norm_graph(6, 17)
    assert len(compile_graph(one, kernel_cache, OFF).kernels) == 3
    assert [len(kernel.outputs) for kernel in compile_graph(one, kernel_cache, ON).kernels] == [2, 1]
    graph = _layer_norm_graph(6, 17, norms=2)
    separate = compile_graph(graph, kernel_cache, OFF)
    joined = compile_graph(graph, kernel_cache, ON)
    assert len(joined.kernels) == len(separate.kernels) - 2
    assert [len(kernel.outputs) for kernel in joined.kernels] == [3, 1, 1, 1]
    inputs = _inputs(graph, offset=1000.0)
    np.testing.assert_array_equal(load_program(joined)(inputs)["y"], load_program(separate)(inputs)["y"])


def test_a_statistic_read_at_another_row_stays_apart(kernel_cache):
    """The second reduction reads the first one's next row: in one kernel that read would race
    with the thread writing it, so the two stay separate kernels (and still compute right)."""
    graph = Graph()
    x = Tensor.input(graph, "x", (6, 9))
    first = x.sum(-1, keepdim=True)  # (6, 1)
    shifted = first.slice(0, 1, 6).pad(((0, 1), (0, 0)))  # row i reads row i + 1's sum
    mark_output(graph, "y", (x * shifted).sum(-1, keepdim=True))
    mark_output(graph, "first", first)
    graph.prune()
    compilation = compile_graph(graph, kernel_cache, ON)
    assert not any(kernel.also for kernel in compilation.kernels)
    inputs = _inputs(graph)
    got = load_program(compilation)(inputs)
    want = interpret(graph, inputs)
    np.testing.assert_allclose(got["y"].reshape(6, 1), want["y"], rtol=1e-5, atol=1e-5)


def _batched_layer_norm(rows: int) -> Graph:
    graph = Graph()
    weight = Tensor.constant(graph, "w", np.linspace(0.5, 2.0, 17))
    bias = Tensor.constant(graph, "b", np.linspace(-1.0, 1.0, 17))
    mark_output(graph, "y", Tensor.input(graph, "x", (rows, 17)).layer_norm(weight, bias, 1e-5))
    graph.prune()
    return graph


@pytest.mark.parametrize("rows", [1, 8, 13, 19])
def test_a_symbolic_batch_runs_its_last_block_short(rows, kernel_cache):
    """The rows are the kernel's last loop, and the batch: blocks up to the runtime row count."""
    graph = _batched_layer_norm(19)
    assert mark_batch(graph, _batched_layer_norm(20))
    compilation = compile_graph(graph, kernel_cache, ON)
    assert any(kernel.also for kernel in compilation.kernels)
    x = np.random.default_rng(rows).standard_normal((rows, 17)).astype(np.float32) + 1000
    got = load_program(compilation)({"x": x})["y"]
    want = F.layer_norm(torch.from_numpy(x).double(), (17,), torch.from_numpy(graph.tensors["w"]).double(),
                        torch.from_numpy(graph.tensors["b"]).double(), 1e-5).numpy()
    np.testing.assert_allclose(got.reshape(rows, 17), want, rtol=5e-4, atol=5e-4)


def test_kernels_are_joined_after_the_search(kernel_cache):
    """The search times single-output kernels; the joined one runs on the default schedule."""
    graph = _layer_norm_graph(64, 33, norms=2)
    options = Options(multi_output=True, search_budget_s=2, search_cache=False)
    searched = compile_graph(graph, kernel_cache, options)
    joined = [kernel.name for kernel in searched.kernels if kernel.also]
    assert joined and not set(joined) & set(searched.schedules)
    assert set(searched.schedules) <= {kernel.name for kernel in searched.kernels}
    inputs = _inputs(graph, offset=3.0)
    plain = compile_graph(graph, kernel_cache, OFF)
    np.testing.assert_allclose(load_program(searched)(inputs)["y"], load_program(plain)(inputs)["y"], rtol=1e-5, atol=1e-5)


def test_each_layer_norm_of_a_lumos_model_is_one_statistics_kernel(kernel_cache):
    """On a small Lumos model (the benchmark models' layers at d=16): with Options.multi_output,
    every layer norm's statistics (the mean, then 1/√(var + ε) from the same row) are one kernel
    with two outputs; without it, two kernels. The C target's graph passes, no search (the siblings
    pass joins whatever kernels the search keeps)."""
    from lumos.compile.compilation import Compilation
    from lumos.compile.frontend.lumos_model import lower_model
    from lumos.compile.program import run_passes
    from lumos.compile.target import CPU
    from lumos.data.contract import FeatureSpec
    from lumos.train.model import LumosModel, ModelConfig

    features = FeatureSpec(token_categorical={"item": 12, "hour": 24}, token_numeric=("value",),
                           static_categorical={"user_country": 5}, future_flags=("sale",), horizons_days=(1, 3),
                           max_len=17)
    config = ModelConfig(d_model=16, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=32, dropout=0.0, max_len=17)
    torch.manual_seed(0)
    model = LumosModel(config, features).eval()
    graph_passes = [step for step in CPU.passes if step[0] in ("egraph", "horizontal", "layout", "schedule", "siblings")]

    def statistics(options: Options) -> dict[str, list[int]]:
        """Per layer norm (its module's path): the outputs of each kernel of its statistics."""
        graph = lower_model(model, 4, 17, symbolic_batch=True)
        kernels = run_passes(graph_passes, Compilation(graph, options), kernel_cache).kernels
        found: dict[str, list[int]] = {}
        for kernel in kernels:
            origin = kernel.node.origin.split(' ("')[0]
            if kernel.kind == "reduce" and origin.startswith("aten.layer_norm"):
                found.setdefault(origin.split(" in ")[-1], []).append(len(kernel.outputs))
        return found

    norms = [name for name, module in model.named_modules() if isinstance(module, torch.nn.LayerNorm)]
    assert len(norms) == 10
    assert statistics(ON) == {name: [2] for name in norms}
    assert statistics(OFF) == {name: [1, 1] for name in norms}
