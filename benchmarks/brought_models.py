"""Models no one here wrote, at two sizes: tiny (tests/unit/compile/test_brought_models.py) and
benchmark (benchmarks/compile.py --models bert gpt2 resnet dlrm).

- `bert`: Hugging Face's BertModel, `gpt2`: GPT2LMHeadModel, both built from a config with random
  weights (nothing downloaded), called on token ids and an attention mask;
- `resnet`: a ResNet-style network written here (torchvision's BasicBlock layout: conv-bn-relu
  stem, max pooling, residual blocks with a strided 1×1 shortcut, global average pooling, linear);
- `dlrm`: a DLRM-style ranking model (EmbeddingBag tables with offsets, a bottom MLP on dense
  features, pairwise dot products of the features, a top MLP, a sigmoid).

Each builder seeds the weights and returns the module in eval mode and its inputs (positional).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Size:
    """One size of every model: tiny for the tests, realistic for the benchmark."""

    batch: int
    seq: int
    hidden: int
    layers: int
    heads: int
    vocab: int
    image: int
    """ResNet input height and width (3 channels)."""
    tables: tuple[int, ...]
    """DLRM embedding table rows."""
    bag: int
    """DLRM ids per bag (at most; bag sizes vary)."""


TINY = Size(batch=2, seq=8, hidden=32, layers=2, heads=2, vocab=100, image=16, tables=(20, 30, 40), bag=3)
BENCH = Size(batch=32, seq=128, hidden=256, layers=4, heads=4, vocab=1000, image=64,
             tables=(10_000, 5_000, 2_000, 1_000, 500, 100, 50, 10), bag=4)


class Transformer(nn.Module):
    """A Hugging Face model's main output as a tensor: what compile_module and inductor are timed on."""

    def __init__(self, model: nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, ids, mask):
        return getattr(self.model(input_ids=ids, attention_mask=mask), self.output)


def bert(size: Size) -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=size.vocab, hidden_size=size.hidden, num_hidden_layers=size.layers,
                                num_attention_heads=size.heads, intermediate_size=4 * size.hidden,
                                max_position_embeddings=max(size.seq, 32))).eval()


def gpt2(size: Size) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=size.vocab, n_embd=size.hidden, n_layer=size.layers,
                                      n_head=size.heads, n_positions=max(size.seq, 32),
                                      bos_token_id=0, eos_token_id=0)).eval()


def text_inputs(size: Size, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a 0/1 attention mask (right padding, every row at least a quarter long)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=generator)
    lengths = torch.randint(max(size.seq // 4, 1), size.seq + 1, (size.batch,), generator=generator)
    mask = (torch.arange(size.seq)[None, :] < lengths[:, None]).long()
    return ids, mask


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with batch norm, and the input added back (through a strided 1×1
    convolution where the shape changes)."""

    def __init__(self, channels_in: int, channels_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels_out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width: int, stages: int, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        widths = [width * 2 ** stage for stage in range(stages)]
        self.blocks = nn.Sequential(*(BasicBlock(widths[max(stage - 1, 0)], widths[stage], 1 if stage == 0 else 2)
                                      for stage in range(stages)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x):  # (B, 3, H, W)
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))  # (B, classes)


def resnet(size: Size) -> nn.Module:
    torch.manual_seed(0)
    model = ResNet(width=size.hidden // 4, stages=max(size.layers // 2, 2))
    for module in model.modules():  # running statistics as a trained network has them, not 0 and 1
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.normal_(0, 0.1)
    return model.eval()


def image_inputs(size: Size, seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(size.batch, 3, size.image, size.image, generator=torch.Generator().manual_seed(seed)),)


class DLRM(nn.Module):
    """Dense features through the bottom MLP, one summed bag of embeddings per table, the
    pairwise dot products of those vectors (below the diagonal), and the top MLP to a probability."""

    def __init__(self, dense: int, tables: tuple[int, ...], dim: int):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for rows in tables)
        self.bottom = nn.Sequential(nn.Linear(dense, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim), nn.ReLU())
        vectors = len(tables) + 1
        self.top = nn.Sequential(nn.Linear(dim + vectors * (vectors - 1) // 2, 4 * dim), nn.ReLU(),
                                 nn.Linear(4 * dim, 1))

    def forward(self, dense, ids, offsets):  # (B, dense), (tables, ids), (tables, B)
        x = self.bottom(dense)  # (B, dim)
        bags = [bag(ids[table], offsets[table]) for table, bag in enumerate(self.embeddings)]
        vectors = torch.stack([x, *bags], dim=1)  # (B, V, dim)
        dots = vectors @ vectors.transpose(1, 2)  # (B, V, V)
        rows, cols = torch.tril_indices(vectors.shape[1], vectors.shape[1], offset=-1)
        return torch.sigmoid(self.top(torch.cat([x, dots[:, rows, cols]], dim=1)))  # (B, 1)


DENSE = 13  # Criteo's dense features


def dlrm(size: Size) -> nn.Module:
    torch.manual_seed(0)
    return DLRM(DENSE, size.tables, dim=size.hidden // 4).eval()


def ranking_inputs(size: Size, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense features, and per table `batch` bags of 1 to `bag` ids: the ids of all tables side by
    side (tables × batch·bag, each table's ids padded with its bags' last ones beyond its total, so
    every table has as many) and the offsets where each bag starts (tables × batch)."""
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(size.batch, DENSE, generator=generator)
    lengths = torch.randint(1, size.bag + 1, (len(size.tables), size.batch), generator=generator)
    lengths[:, -1] += size.batch * size.bag - lengths.sum(1)  # the last bag takes the rest: equal totals
    offsets = torch.cumsum(lengths, 1) - lengths
    ids = torch.stack([torch.randint(0, rows, (size.batch * size.bag,), generator=generator) for rows in size.tables])
    return dense, ids, offsets


MODELS = {"bert": (bert, text_inputs), "gpt2": (gpt2, text_inputs), "resnet": (resnet, image_inputs),
          "dlrm": (dlrm, ranking_inputs)}
