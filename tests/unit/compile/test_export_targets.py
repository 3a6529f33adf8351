"""compile_module's two defaults: the schedule search ("auto" budget, cached by kernel, target and
machine) and the target of the inputs' device (CUDA tensors → the CUDA target). The CUDA programs
are built by NVRTC here; running them needs a GPU (pytest -m gpu)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lumos.compile.frontend import export
from lumos.compile.frontend.export import (
    build_exported,
    compile_module,
    export_module,
    kernel_cache_for,
    requested_budget,
    search_seconds,
    target_for,
)
from lumos.compile.frontend.partition import EagerFallbackWarning
from lumos.compile.program import Options
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import CPU, CUDA
from lumos.core.errors import UsageError

B, T, C = 3, 7, 8


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(C, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, C)).eval()


def encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, 2, 16, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


# ---------------------------------------------------------------------------------------------
# The target follows the device


def test_the_target_follows_the_inputs_device():
    assert target_for([]) is CPU  # a module without tensor inputs or weights
    assert target_for([torch.device("cpu"), torch.device("cpu")]) is CPU
    assert target_for([torch.device("cuda", 0)]) is CUDA
    assert target_for([torch.device("cuda", 0), torch.device("cuda")]) is CUDA
    with pytest.raises(UsageError, match="cpu and cuda"):
        target_for([torch.device("cpu"), torch.device("cuda", 0)])
    with pytest.raises(UsageError, match="meta"):
        target_for([torch.device("meta")])


def test_inputs_and_weights_on_different_devices_are_refused_before_export(kernel_cache):
    with pytest.raises(UsageError, match="cpu and meta"):
        compile_module(nn.Linear(C, C, device="meta"), [torch.randn(B, C)], kernel_cache)


def test_a_kernel_cache_serves_the_other_target_from_its_sibling_folder(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    assert kernel_cache_for(cache, CPU) is cache
    cuda = kernel_cache_for(cache, CUDA)
    assert cuda.target == "cuda" and cuda.root == tmp_path / "cuda"


def test_a_module_builds_for_the_cuda_target_without_a_gpu(tmp_path):
    """The CUDA path up to the PTX: export, lower, the CUDA target's passes, NVRTC."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="the CUDA target needs cuda-bindings (the cuda extra)")
    module, x = encoder(), torch.randn(B, T, C)
    cache = kernel_cache_for(KernelCache(tmp_path, "cpu"), CUDA)
    compilation, used = build_exported(module, export_module(module, [x]), [x], cache, Options(), CUDA, "auto")
    assert compilation.target == "cuda" and used == [0]
    assert compilation.search is None  # the CUDA target has no search pass yet: the budget is ignored
    assert compilation.cuda.launches and compilation.attention == 2  # one per layer, online softmax
    assert compilation.build.library.name == "kernels.ptx" and b".entry" in compilation.build.library.read_bytes()
    assert (tmp_path / "cuda") in compilation.build.library.parents  # the kernel cache's CUDA folder


# ---------------------------------------------------------------------------------------------
# The search budget


def test_the_auto_budget_is_seconds_per_distinct_kernel_up_to_a_cap(monkeypatch):
    assert search_seconds("auto", 3) == 3 * export.SEARCH_S_PER_KERNEL
    assert search_seconds("auto", 1000) == export.SEARCH_CAP_S
    assert search_seconds(7.5, 1000) == 7.5 and search_seconds(0, 3) == 0.0
    monkeypatch.delenv("LUMOS_SEARCH_BUDGET")
    assert requested_budget(None, Options()) == "auto"  # the default
    assert requested_budget(0, Options()) == 0 and requested_budget(None, Options(search_budget_s=5)) == 5
    assert requested_budget("auto", Options(search_budget_s=5)) == "auto"  # the argument wins
    monkeypatch.setenv("LUMOS_SEARCH_BUDGET", "12")
    assert requested_budget(None, Options()) == 12.0
    for wrong in ("soon", -1):
        monkeypatch.setenv("LUMOS_SEARCH_BUDGET", str(wrong))
        with pytest.raises(UsageError, match="LUMOS_SEARCH_BUDGET"):
            requested_budget(None, Options())
    with pytest.raises(UsageError, match="search_budget"):
        requested_budget("fast", Options())


def test_compile_module_searches_by_default_and_a_second_compile_hits_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("LUMOS_SEARCH_BUDGET")  # the default, as a user gets it ...
    monkeypatch.setattr(export, "SEARCH_S_PER_KERNEL", 0.3)  # ... at a unit test's pace
    module, x = mlp(), torch.randn(B, T, C)
    cache = KernelCache(tmp_path, "cpu")
    first = compile_module(module, [x], cache)
    search = first.compilation.search
    distinct = len(search.groups)
    assert distinct >= 2 and search.budget_s == pytest.approx(0.3 * distinct)
    assert search.rounds >= 1 and not search.cache_hit  # measured
    assert any((tmp_path / "cpu" / "search").rglob("*.json"))  # stored under the kernel cache
    again = compile_module(module, [x], cache)  # a second compile (any process: the cache is on disk)
    assert again.compilation.search.rounds == 0 and again.compilation.search.cache_hit
    assert again.compilation.schedules == first.compilation.schedules
    torch.testing.assert_close(again(x), module(x), atol=1e-4, rtol=1e-4)
    unsearched = compile_module(module, [x], cache, search_budget=0)
    assert unsearched.compilation.search is None


def test_compile_module_gives_the_egraph_programs_their_share_of_the_budget(tmp_path):
    """With Options.egraph_fusion, the climb over the e-graph's programs searches too (a quarter
    of the budget, before the schedule search), not only reports what it proposed."""
    module, x = mlp(), torch.randn(B, T, C)
    compiled = compile_module(module, [x], KernelCache(tmp_path, "cpu"), Options(egraph_fusion=True), search_budget=2.0)
    programs = compiled.compilation.programs
    assert programs["proposed"] and programs["tried"]  # timed, the scheduler's program first
    assert compiled.compilation.search.budget_s == pytest.approx(2.0 * 0.75)
    torch.testing.assert_close(compiled(x), module(x), atol=1e-4, rtol=1e-4)


def test_partitions_and_the_backend_pass_the_budget_on(monkeypatch, tmp_path):
    """A partition is compiled with the module's budget (here 0), the backend with its own."""
    from lumos.compile.frontend.torch_backend import make_backend

    monkeypatch.delenv("LUMOS_SEARCH_BUDGET")

    class CumprodAfter(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = mlp()

        def forward(self, x):
            return torch.cumprod(self.inner(x), dim=1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        partitioned = compile_module(CumprodAfter(), [torch.randn(B, T, C)], KernelCache(tmp_path, "cpu"),
                                     search_budget=0)
    assert partitioned.partitions and all(part.compilation.search is None for part in partitioned.partitions)
    torch._dynamo.reset()
    try:
        module, x = mlp(), torch.randn(B, T, C)
        fast = torch.compile(module, backend=make_backend(KernelCache(tmp_path, "cpu"), search_budget=0))
        with torch.no_grad():
            torch.testing.assert_close(fast(x), module(x), atol=1e-4, rtol=1e-4)
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# On a GPU (pytest -m gpu)

@pytest.mark.parametrize("make", [mlp, encoder])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compile_module_on_cuda_inputs_returns_cuda_tensors(make, tmp_path):
    module = make().cuda()
    x = torch.randn(B, T, C, device="cuda")
    compiled = compile_module(module, [x], KernelCache(tmp_path, "cpu"))  # verified against eager on the GPU
    assert compiled.target is CUDA and compiled.max_error < 1e-4
    for rows in (B, 1, 2 * B + 1) if compiled.batch else (B,):  # chunks of the example's batch
        y = torch.randn(rows, T, C, device="cuda")
        got = compiled(y)
        assert got.is_cuda and got.dtype == torch.float32
        with torch.no_grad():
            torch.testing.assert_close(got, module(y), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="compiled for CUDA"):
        compiled(x.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_torch_compile_on_cuda_inputs_returns_cuda_tensors(monkeypatch, tmp_path):
    monkeypatch.setenv("LUMOS_KERNEL_CACHE", str(tmp_path))  # the registered backend's default cache
    module = encoder().cuda()
    torch._dynamo.reset()
    try:
        fast = torch.compile(module, backend="lumos")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", EagerFallbackWarning)  # every op compiled
            for seed in (1, 2):
                x = torch.randn(B, T, C, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
                got = fast(x)
                assert got.is_cuda
                torch.testing.assert_close(got, module(x), atol=1e-4, rtol=1e-4)
    finally:
        torch._dynamo.reset()
    assert any((tmp_path / "cuda").rglob("kernels.ptx"))  # the CUDA target built it
