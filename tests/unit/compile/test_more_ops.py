"""Issue 64's ops in the general frontend (convolution, indexing, embedding bags, cumsum,
index_add, scatter_add), each compiled through `compile_module` at awkward sizes and checked
against eager at 1e-4 on the inputs it was compiled with (compile_module's own check) and on
fresh ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lumos.compile.frontend.export import CompiledModule, compile_module, export_module, verify_module
from lumos.compile.frontend.lumos_model import UnsupportedOp, lower_program
from lumos.compile.ir.interpret import interpret


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check(module: nn.Module, inputs, kernel_cache) -> CompiledModule:
    """Compiled (and so verified) on inputs(0), then verified on inputs(1)."""
    compiled = compile_module(module, inputs(0), kernel_cache)
    error = verify_module(compiled, module, [inputs(1)])
    assert error < 1e-4 and compiled.max_error < 1e-4
    return compiled


# ---------------------------------------------------------------------------------------------
# Convolution: im2col in views and the matmul

CONVOLUTIONS = {
    "conv1d_stride_padding": (lambda: nn.Conv1d(3, 5, 3, stride=2, padding=1), (2, 3, 17)),
    "conv1d_groups_dilation_same": (lambda: nn.Conv1d(4, 6, 3, dilation=2, groups=2, padding="same"), (3, 4, 17)),
    "conv1d_even_kernel_same": (lambda: nn.Conv1d(3, 2, 4, padding="same", bias=False), (2, 3, 17)),
    "conv2d_rectangular": (lambda: nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
                           (2, 3, 9, 7)),
    "conv2d_groups_same": (lambda: nn.Conv2d(4, 6, 3, groups=2, padding="same", bias=False), (3, 4, 5, 6)),
    "conv2d_depthwise": (lambda: nn.Conv2d(3, 3, 3, groups=3, padding=1), (2, 3, 5, 7)),
    "conv2d_pointwise": (lambda: nn.Conv2d(3, 5, 1), (2, 3, 5, 7)),
    "conv1d_unbatched": (lambda: nn.Conv1d(3, 2, 2), (3, 17)),
    "conv3d": (lambda: nn.Conv3d(2, 3, (2, 3, 1), stride=(1, 2, 1), padding=(1, 0, 1)), (2, 2, 3, 7, 2)),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")  # torch's own note on its copy
@pytest.mark.parametrize("name", list(CONVOLUTIONS))
def test_convolution_matches_eager(name, kernel_cache):
    make, shape = CONVOLUTIONS[name]
    torch.manual_seed(0)
    check(make(), lambda seed: (torch.randn(shape, generator=seeded(seed)),), kernel_cache)


class ConvNet(nn.Module):
    """A conv, an activation and a second conv on its output: convolutions read computed nodes."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 4, 3, padding=1)
        self.second = nn.Conv2d(4, 2, 2, stride=2)

    def forward(self, x):
        return self.second(torch.relu(self.first(x))).flatten(1)


def test_stacked_convolutions_match_eager(kernel_cache):
    torch.manual_seed(0)
    compiled = check(ConvNet(), lambda seed: (torch.randn(3, 3, 7, 9, generator=seeded(seed)),), kernel_cache)
    assert compiled.batch == 3  # the windows read each image's rows only: any batch runs (checked at 2 and 4)


def test_transposed_convolution_is_unsupported(kernel_cache):
    with pytest.raises(UnsupportedOp, match="conv_transpose1d|transposed"):
        compile_module(nn.ConvTranspose1d(3, 2, 3), (torch.randn(2, 3, 5),), kernel_cache, strict=True)


# ---------------------------------------------------------------------------------------------
# Indexing through the GATHER primitive


class Indexing(nn.Module):
    """x[:, idx] by a buffer, an input and a literal with a negative index; two index tensors on
    axes apart and on adjacent axes; the first axis; index_select; gather along two axes with a
    shorter index."""

    def __init__(self):
        super().__init__()
        self.register_buffer("picked", torch.tensor([4, 0, 16, 4]))

    def forward(self, x, ids, rows, along, columns):
        return (
            x[:, self.picked],
            x[:, ids] * 2.0,
            x[:, [2, 0, -1]],
            x[rows, :, rows[:2, None]],
            x[:, ids[:2, None], ids[None, 2:]],
            x[ids[:2]],
            torch.index_select(x, 1, ids[:2] + 3),
            torch.gather(x, 1, along),
            torch.gather(x, 2, columns),
        )


def indexing_inputs(seed: int):
    generator = seeded(seed)
    return (torch.randn(3, 17, 3, generator=generator), torch.randint(-3, 3, (5,), generator=generator),
            torch.randint(0, 3, (3, 1), generator=generator), torch.randint(0, 17, (2, 5, 3), generator=generator),
            torch.randint(0, 3, (3, 4, 2), generator=generator))


def test_indexing_matches_eager(kernel_cache):
    check(Indexing(), indexing_inputs, kernel_cache)


class MaskIndex(nn.Module):
    def forward(self, x):
        return x[:, x[0] > 0].sum()


def test_bool_mask_index_is_unsupported(kernel_cache):
    with pytest.raises(UnsupportedOp):
        compile_module(MaskIndex(), (torch.randn(3, 5),), kernel_cache, strict=True)


# ---------------------------------------------------------------------------------------------
# Embedding bags: fixed bags (a 2-d input) and bags from offsets


class Bags(nn.Module):
    def __init__(self, mode: str, padding_idx: int | None = None, include_last_offset: bool = False):
        super().__init__()
        self.bag = nn.EmbeddingBag(17, 5, mode=mode, padding_idx=padding_idx, include_last_offset=include_last_offset)

    def forward(self, ids, offsets, weights=None):
        return self.bag(ids, offsets, per_sample_weights=weights)


class FixedBags(nn.Module):
    def __init__(self, mode: str, padding_idx: int | None = None):
        super().__init__()
        self.bag = nn.EmbeddingBag(17, 5, mode=mode, padding_idx=padding_idx)

    def forward(self, ids, weights=None):
        return self.bag(ids, per_sample_weights=weights)


def bag_inputs(seed: int, include_last_offset: bool = False, weighted: bool = False):
    """13 ids in 4 bags, the third empty; id 3 (the padding row where there is one) appears."""
    generator = seeded(seed)
    ids = torch.randint(0, 17, (13,), generator=generator)
    ids[[1, 7]] = 3
    offsets = torch.tensor([0, 5, 9, 9] + ([13] if include_last_offset else []))
    weights = (torch.rand(13, generator=generator),) if weighted else ()
    return (ids, offsets, *weights)


def fixed_bag_inputs(seed: int, weighted: bool = False):
    generator = seeded(seed)
    ids = torch.randint(0, 17, (3, 7), generator=generator)
    ids[0, :2] = 3
    ids[2, :] = 3  # a bag of padding only
    return (ids, torch.rand(3, 7, generator=generator)) if weighted else (ids,)


BAGS = {
    "sum_weighted": (lambda: Bags("sum"), lambda seed: bag_inputs(seed, weighted=True)),
    "mean_padding": (lambda: Bags("mean", padding_idx=3), bag_inputs),
    "max": (lambda: Bags("max"), bag_inputs),
    "max_padding_last_offset": (lambda: Bags("max", padding_idx=3, include_last_offset=True),
                                lambda seed: bag_inputs(seed, include_last_offset=True)),
    "fixed_sum_weighted": (lambda: FixedBags("sum"), lambda seed: fixed_bag_inputs(seed, weighted=True)),
    "fixed_mean_padding": (lambda: FixedBags("mean", padding_idx=3), fixed_bag_inputs),
    "fixed_max": (lambda: FixedBags("max"), fixed_bag_inputs),
}


@pytest.mark.parametrize("name", list(BAGS))
def test_embedding_bag_matches_eager(name, kernel_cache):
    make, inputs = BAGS[name]
    torch.manual_seed(0)
    check(make(), inputs, kernel_cache)


# ---------------------------------------------------------------------------------------------
# Scans and scatters as products with literal 0/1 patterns


class Scatters(nn.Module):
    def forward(self, x, ids, along, source):
        return (
            torch.cumsum(x, dim=1),
            torch.cumsum(x, dim=-1) - x,
            x.index_add(1, ids, source, alpha=0.5),
            x.scatter_add(1, along, source[:, :5].transpose(1, 2)[:2]),
        )


def scatter_inputs(seed: int):
    generator = seeded(seed)
    ids = torch.randint(0, 17, (5,), generator=generator)
    ids[1] = ids[3]  # a repeated id adds twice
    return (torch.randn(3, 17, 3, generator=generator), ids, torch.randint(0, 17, (2, 3, 3), generator=generator),
            torch.randn(3, 5, 3, generator=generator))


def test_cumsum_index_add_scatter_add_match_eager(kernel_cache):
    check(Scatters(), scatter_inputs, kernel_cache)


class Puts(nn.Module):
    """Writes through indices (index_put): adjacent and apart axes, negative ids, accumulated
    repeats, a bool mask."""

    def forward(self, x, ids, rows, mask):
        replaced = x.clone()
        replaced[:, ids] = torch.ones(5, 3) * 2.0
        added = x.clone()
        added[:, ids - 17] += x[:, :5]
        apart = x.clone()
        apart[rows, :, rows] = 1.5
        repeated = torch.zeros(17, 3).index_put_((torch.cat([ids, ids]),), x[0, :10], accumulate=True)
        masked = x.clone()
        masked[mask] = -1.0
        return replaced, added, apart, repeated, masked


def put_inputs(seed: int):
    generator = seeded(seed)
    return (torch.randn(3, 17, 3, generator=generator), torch.randperm(17, generator=generator)[:5],
            torch.randperm(3, generator=generator)[:2], torch.rand(3, 17, generator=generator) > 0.5)


def test_index_put_matches_eager(kernel_cache):
    check(Puts(), put_inputs, kernel_cache)


def test_core_aten_index_add_lowers():
    """A fully decomposed export writes index_add as index_put (accumulate): that lowers too."""
    inputs = scatter_inputs(0)
    program = export_module(Scatters(), inputs).run_decompositions()
    assert any("index_put" in str(node.target) for node in program.graph.nodes)
    graph = lower_program(program, list(program.graph_signature.user_inputs), [f"output{i}" for i in range(4)])
    got = interpret(graph, dict(zip(program.graph_signature.user_inputs, (value.float().numpy() for value in inputs),
                                    strict=True)))
    for index, want in enumerate(Scatters()(*inputs)):
        np.testing.assert_allclose(got[f"output{index}"], want.numpy(), atol=1e-4, rtol=1e-4)


class ArgMax(nn.Module):
    def forward(self, x):
        return torch.argmax(x, dim=-1)


def test_argmax_stays_unsupported(kernel_cache):
    """argmax, argmin and topk need an index-carrying reduction, which the IR lacks."""
    with pytest.raises(UnsupportedOp, match="aten.argmax"):
        compile_module(ArgMax(), (torch.randn(3, 5),), kernel_cache, strict=True)
