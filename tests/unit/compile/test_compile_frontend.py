"""The frontend names an op it cannot lower and the model code it came from."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lumos.compile.frontend.lumos_model import UnsupportedOp, lower_program


class Cumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cumprod(self.scale(x), dim=1)


def test_unsupported_op_names_the_op_and_its_origin():
    program = torch.export.export(Cumulative(), (torch.randn(2, 4),))
    with pytest.raises(UnsupportedOp) as raised:
        lower_program(program, ["x"], ["y"])
    message = str(raised.value)
    assert "aten.cumprod" in message and "test_compile_frontend.py" in message and "torch.cumprod" in message


def test_a_supported_module_lowers():
    program = torch.export.export(nn.Sequential(nn.Linear(4, 3), nn.GELU(), nn.LayerNorm(3)), (torch.randn(2, 4),))
    graph = lower_program(program, ["x"], ["y"])
    assert set(graph.inputs) == {"x"} and graph.output_shapes == {"y": (2, 3)}
