"""Gathers on the CUDA target, run on the CPU (cuda_on_cpu.py): the bounds check of a gather
compares its row with the rows of the view it reads the table through, which may reshape the
table. Hugging Face BERT reads its (batch, length) attention mask by flat index through a
(batch · length, 1) view; checked against the table node's own rows (the batch), every id past
the first row read 0: BERT's attention lost its mask and batch row 0 was off by 0.02."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cuda_on_cpu import run_on_cpu

from lumos.compile.frontend.export import lower_module
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import Options, compile_graph
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import CUDA

pytest.importorskip("cuda.bindings.nvrtc", reason="the CUDA target needs cuda-bindings (the cuda extra)")


class FlatIndex(torch.nn.Module):
    """x of shape (2, 8) read by flat index (0..15) into (2, 1, 1, 8): BERT's mask expansion."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("at", torch.arange(16).reshape(2, 1, 1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1)[self.at] * 2.0


def test_a_gather_through_a_reshaping_view_reads_every_row(tmp_path):
    x = torch.arange(1.0, 17.0).reshape(2, 8)
    graph, _ = lower_module(FlatIndex().eval(), (x,))
    compilation = compile_graph(graph, KernelCache(tmp_path, "cuda"), Options(arch="sm_80"), target=CUDA)
    inputs = {name: x.numpy() for name in graph.inputs}
    got, want = run_on_cpu(compilation, inputs, tmp_path), interpret(graph, inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name].reshape(value.shape), value)
        np.testing.assert_array_equal(value.ravel(), 2.0 * x.numpy().ravel())  # every id in range: no zeros
