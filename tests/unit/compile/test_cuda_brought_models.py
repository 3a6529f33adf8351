"""The models people bring (benchmarks/brought_models.py: BERT, GPT-2, ResNet, DLRM) on the CUDA
target, run on the CPU (cuda_on_cpu.py) against the interpreter; test_cuda_gpu.py runs kernels on
a GPU where one is lent.

What this found: the bounds check of a gather compared its row with the table node's own rows,
not the rows of the view it reads the table through. Hugging Face BERT reads its (batch, length)
attention mask by flat index through a (batch · length, 1) view, so every id past the first row
read 0: BERT's attention lost its mask and its output was 0.02 off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cuda_on_cpu import run_on_cpu
from test_brought_models import TINY, brought

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


def run_both(model: torch.nn.Module, example: tuple[torch.Tensor, ...], folder) -> list[tuple[np.ndarray, np.ndarray]]:
    """(the CUDA program's output run on the CPU, the interpreter's) for each output."""
    graph, _ = lower_module(model.eval(), example)
    compilation = compile_graph(graph, KernelCache(folder, "cuda"), Options(arch="sm_80"), target=CUDA)
    inputs = {name: value.numpy() for name, value in zip(graph.inputs, example, strict=True)}
    got, want = run_on_cpu(compilation, inputs, folder), interpret(graph, inputs)
    return [(got[name].reshape(value.shape), value) for name, value in want.items()]


def test_a_gather_through_a_reshaping_view_reads_every_row(tmp_path):
    x = torch.arange(1.0, 17.0).reshape(2, 8)
    for got, want in run_both(FlatIndex(), (x,), tmp_path):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(want.ravel(), 2.0 * x.numpy().ravel())  # every id in range: no zeros


class Logits(torch.nn.Module):
    """GPT-2's logits alone (its KV cache is a structure the export does not flatten here)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt2 = brought.gpt2(TINY)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.gpt2(input_ids=input_ids, attention_mask=attention_mask).logits


@pytest.mark.slow  # four programs built and run on the CPU emulation: about 35 s
@pytest.mark.parametrize("name", ["bert", "gpt2", "resnet", "dlrm"])
def test_each_brought_model_s_cuda_program_computes_what_the_interpreter_does(name, tmp_path):
    if name in ("bert", "gpt2"):
        pytest.importorskip("transformers")  # a safety net: CI installs it (pyproject's dev extra)
    model, example = {"bert": lambda: (brought.bert(TINY), brought.text_inputs(TINY, 1)),
                      "gpt2": lambda: (Logits(), brought.text_inputs(TINY, 1)),
                      "resnet": lambda: (brought.resnet(TINY), brought.image_inputs(TINY, 1)),
                      "dlrm": lambda: (brought.dlrm(TINY), brought.ranking_inputs(TINY, 1))}[name]()
    for got, want in run_both(model, example, tmp_path):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
