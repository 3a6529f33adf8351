"""SASRec baseline (Kang & McAuley, 2018) on a Lumos leave-last-out sequences table, same protocol.

A plain causal self-attention next-item model, trained and scored on exactly the data Lumos
trains and evaluates on: the same table version, read with pyarrow from its Delta log, the same
valid and test rows (their histories are what the model sees), the same ranking over the full
item vocabulary with the row's history items excluded, the same metric code
(`lumos.train.retrieval_metrics`), and early stopping on valid NDCG@10 with the best epoch's weights kept.

Training uses every train target once per epoch: each user's sequence up to (not including) the
valid target is rebuilt from the table's train rows, cut into windows of max_len + 1 items from
the end, and trained causally with a full softmax over the item vocabulary (cross-entropy;
Klenitskiy & Vasilev 2023 show it beats the original one-negative binary loss). Needs a table
ingested with splits.train_targets = "every" (every train row's target follows the last item of
its history; MovieLens has no repeated user-item pair, so the chain is unique) or "windows" (the
rows' histories and targets tile the sequence; concatenated in time order).

    python benchmarks/sasrec.py --workspace . --table movielens.sequences --seeds 0 1 2

Writes benchmarks/results/sasrec-<table>.json and prints the metrics per seed and mean ± std.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.contract import FIRST_TOKEN_ID
from lumos.data.sequences_version import open_sequences
from lumos.train import retrieval_metrics as M

RESULTS = Path(__file__).resolve().parent / "results"
METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr")


@dataclass(frozen=True)
class SASRecConfig:
    """The defaults are the setting chosen on MovieLens-100K's valid NDCG@10 (seed 0) over six
    trials, as many as Lumos's recipe got: dropout 0.2 → 0.3, then batch 32 → 128; attention
    dropout 0, lr 1e-3 and max_len 50 were tried and lost (docs/movielens-experiments.md)."""

    d_model: int = 64
    n_heads: int = 2
    layers: int = 2
    dropout: float = 0.3
    attention_dropout: float | None = None
    """Dropout on attention weights; None: as `dropout` (0 lets the fused attention kernel run)."""
    max_len: int | None = None
    """Items of history the model reads (the most recent); None: the table's tokens.max_len."""
    lr: float = 2e-3
    weight_decay: float = 0.0
    batch_size: int = 128
    """Windows per batch (of up to 201 items on MovieLens, max_len 200)."""
    max_epochs: int = 100
    patience: int = 8
    """Epochs without a better valid NDCG@10 before stopping; the best epoch's weights are kept."""
    keep_best: bool = True
    """False: train max_epochs and keep the last epoch's weights, so that no split chooses them
    (benchmarks/selection.py compares validations on equal terms)."""
    exclude_seen: bool = False
    """Leave the items a position has already seen out of its softmax, as Lumos's
    model.exclude_seen_in_loss does (the protocol excludes them when ranking)."""
    seed: int = 0


# ---------------------------------------------------------------------------------------------
# Data: the sequences table version, read with pyarrow


@dataclass
class SplitRows:
    users: list[str]
    histories: list[list[int]]
    """Item ids of each row's history, oldest first (at most the table's max_len)."""
    targets: np.ndarray
    as_of: list
    """Each row's cut time (its target's timestamp)."""


@dataclass
class TableData:
    ref: str
    item_vocab_size: int
    max_len: int
    train_sequences: list[list[int]]
    """Per user: every item before the valid target, in token order."""
    valid: SplitRows
    test: SplitRows
    holdout: SplitRows
    """The held-out users' rows (splits.holdout_users), none otherwise: they never train."""


def read_table(workspace_dir: str, table: str) -> TableData:
    workspace = open_workspace(workspace_dir)
    sequences = open_sequences(workspace, TableRef.parse(table))
    parts = [pq.read_table(f.path, columns=["user_id", "split", "as_of", "item", "next_item"]) for f in sequences.snapshot.files]
    rows = {split: _split_rows(parts, split) for split in ("train", "valid", "test", "holdout")}
    layout = sequences.recipe["splits"]["train_targets"]
    rebuild = {"every": _chained_sequences, "windows": _tiled_sequences}.get(layout)
    if rebuild is None:
        raise ValueError(f'{sequences.ref}: SASRec needs splits.train_targets = "every" or "windows", not {layout!r}')
    return TableData(
        ref=str(sequences.ref), item_vocab_size=sequences.spec.item_vocab_size, max_len=sequences.spec.max_len,
        train_sequences=_checked(rebuild(rows["train"]), rows["valid"]), valid=rows["valid"], test=rows["test"],
        holdout=rows["holdout"],
    )


def _split_rows(parts, split: str) -> SplitRows:
    users, as_of, histories, targets = [], [], [], []
    for part in parts:
        chosen = part.filter(pc.equal(part["split"], split))
        users += chosen["user_id"].to_pylist()
        as_of += chosen["as_of"].to_pylist()
        histories += chosen["item"].to_pylist()
        targets += chosen["next_item"].to_pylist()
    return SplitRows(users, histories, np.asarray(targets, dtype=np.int64), as_of)


def _chained_sequences(train: SplitRows) -> dict[str, list[int]]:
    """"every" rows: a row's target follows the last item of its history, and the row with a
    one-item history starts the chain."""
    following: dict[str, dict[int, int]] = {}
    first: dict[str, int] = {}
    for user, history, target in zip(train.users, train.histories, train.targets.tolist(), strict=True):
        following.setdefault(user, {})[history[-1]] = target
        if len(history) == 1:
            first[user] = history[0]
    sequences = {}
    for user, after in following.items():
        chain = [first[user]] if user in first else []
        while chain and chain[-1] in after:
            chain.append(after[chain[-1]])
            if len(chain) > len(after) + 1:
                raise ValueError(f"user {user}: the train rows do not form one chain (a repeated item?)")
        sequences[user] = chain
    return sequences


def _tiled_sequences(train: SplitRows) -> dict[str, list[int]]:
    """"windows" rows: each row's history and target follow the previous row's target."""
    windows: dict[str, list] = {}
    for user, as_of, history, target in zip(train.users, train.as_of, train.histories, train.targets.tolist(), strict=True):
        windows.setdefault(user, []).append((as_of, history + [target]))
    return {user: [item for _, window in sorted(rows, key=lambda row: row[0]) for item in window]
            for user, rows in windows.items()}


def _checked(sequences: dict[str, list[int]], valid: SplitRows) -> list[list[int]]:
    """Per valid row, its user's items before the valid target; they must end with its history."""
    rebuilt = []
    for user, history in zip(valid.users, valid.histories, strict=True):
        sequence = sequences.get(user, [])
        if sequence[-len(history):] != history:
            raise ValueError(f"user {user}: the rebuilt sequence does not end with the valid row's history; "
                             "was the table ingested with min_history = 1?")
        rebuilt.append(sequence)
    return rebuilt


def training_windows(sequences: list[list[int]], max_len: int) -> np.ndarray:
    """(N, max_len + 1) windows, right-aligned and 0-padded on the left, cut from each sequence's
    end so that every item after the first is a target exactly once."""
    windows = []
    for sequence in sequences:
        end = len(sequence)
        while end > 1:
            start = max(0, end - max_len - 1)
            window = sequence[start:end]
            windows.append([0] * (max_len + 1 - len(window)) + window)
            end = start + 1  # the next window's last item is this window's first (input only here)
    return np.asarray(windows, dtype=np.int64)


def padded(histories: list[list[int]], max_len: int) -> np.ndarray:
    """(B, max_len) histories, right-aligned, 0-padded on the left."""
    out = np.zeros((len(histories), max_len), dtype=np.int64)
    for row, history in enumerate(histories):
        if history:
            out[row, -len(history):] = history[-max_len:]
    return out


# ---------------------------------------------------------------------------------------------
# Model


class CausalSelfAttention(nn.Module):
    def __init__(self, config: SASRecConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.attention_dropout = config.dropout if config.attention_dropout is None else config.attention_dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, nh, T, D) each
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], dropout_p=self.attention_dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config: SASRecConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.ff = nn.Sequential(nn.Linear(config.d_model, config.d_model), nn.GELU(), nn.Dropout(config.dropout),
                                nn.Linear(config.d_model, config.d_model), nn.Dropout(config.dropout))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        x = x + self.dropout(self.attn(self.ln_1(x), allowed))
        return x + self.ff(self.ln_2(x))


class SASRec(nn.Module):
    """Item + learned position embeddings, causal pre-LN blocks, scores tied to the item table."""

    def __init__(self, config: SASRecConfig, item_vocab_size: int, max_len: int):
        super().__init__()
        self.items = nn.Embedding(item_vocab_size, config.d_model, padding_idx=0)
        self.positions = nn.Embedding(max_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.layers)])
        self.ln = nn.LayerNorm(config.d_model)
        self.scale = math.sqrt(config.d_model)
        nn.init.normal_(self.items.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, items: Tensor) -> Tensor:
        """(B, T) left-padded item ids → (B, T, C) hidden states, each seeing only itself and earlier items."""
        B, T = items.shape
        real = items != 0  # (B, T)
        x = self.items(items) * self.scale + self.positions(torch.arange(T, device=items.device))  # (B, T, C)
        x = self.dropout(x) * real[:, :, None]
        causal = torch.ones(T, T, dtype=torch.bool, device=items.device).tril()  # (T, T) True = may attend
        # Real earlier keys only; a padded query attends to itself so that no row is empty (its output is unused).
        allowed = (causal & real[:, None, :]) | torch.eye(T, dtype=torch.bool, device=items.device)  # (B, T, T)
        for block in self.blocks:
            x = block(x, allowed)
        return self.ln(x)

    def scores(self, hidden: Tensor) -> Tensor:
        """(..., C) → (..., V) logits over the item vocabulary; padding and OOV never win."""
        logits = hidden @ self.items.weight.T
        logits[..., :FIRST_TOKEN_ID] = float("-inf")
        return logits


# ---------------------------------------------------------------------------------------------
# Training and scoring


def rank_rows(model: SASRec, rows: SplitRows, table_max_len: int, max_len: int, batch_size: int = 512) -> Tensor:
    """1-based ranks of each row's target over the full vocabulary, the row's whole history (as
    the table holds it) excluded; the model reads its `max_len` most recent items."""
    model.eval()
    histories = torch.from_numpy(padded(rows.histories, table_max_len))
    targets = torch.from_numpy(rows.targets)
    ranks = []
    with torch.no_grad():
        for start in range(0, len(targets), batch_size):
            history = histories[start:start + batch_size]
            scores = model.scores(model(history[:, -max_len:])[:, -1])
            ranks.append(M.target_ranks(scores, targets[start:start + batch_size], history, exclude_history=True))
    return torch.cat(ranks)


def seen_items(inputs: Tensor) -> Tensor:
    """(B, T, T) the item ids each position of left-padded inputs (B, T) has seen: itself and
    every earlier input; 0 elsewhere."""
    T = inputs.shape[1]
    seen = torch.arange(T) <= torch.arange(T)[:, None]  # (T, T): position, input
    return torch.where(seen, inputs[:, None, :], 0)


def train_and_score(data: TableData, config: SASRecConfig, report=print) -> dict:
    model, best, seconds = train_model(data, config, report)
    max_len = config.max_len or data.max_len
    test = M.retrieval_metrics(rank_rows(model, data.test, data.max_len, max_len))
    return {"seed": config.seed, "best_epoch": best["epoch"], "valid_ndcg@10": best["ndcg@10"],
            "seconds": seconds, "parameters": sum(p.numel() for p in model.parameters()),
            **{name: test[name] for name in METRICS}, "test_rows": int(test["scored_rows"])}


def train_model(data: TableData, config: SASRecConfig, report=print) -> tuple[SASRec, dict, float]:
    """The trained model (the best valid epoch's weights, or the last with keep_best = False), the
    best epoch's valid NDCG@10 and number, and the seconds it took."""
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    max_len = config.max_len or data.max_len
    if max_len > data.max_len:
        raise ValueError(f"max_len {max_len} is above the table's tokens.max_len ({data.max_len})")
    model = SASRec(config, data.item_vocab_size, max_len + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))
    windows = torch.from_numpy(training_windows(data.train_sequences, max_len))
    best = {"ndcg@10": -1.0, "epoch": 0, "state": None}
    started = time.perf_counter()
    for epoch in range(1, config.max_epochs + 1):
        model.train()
        order = torch.randperm(len(windows))
        total, count = 0.0, 0
        for start in range(0, len(order), config.batch_size):
            window = windows[order[start:start + config.batch_size]]
            inputs, targets = window[:, :-1], window[:, 1:]  # (B, T) each
            mask = (targets >= FIRST_TOKEN_ID) & (inputs != 0)  # (B, T): positions with an item and a target
            logits = model.scores(model(inputs)[mask])  # (N, V)
            if config.exclude_seen:  # id 0 is padding, at -inf already; the target is never left out
                seen = seen_items(inputs)[mask]  # (N, T)
                logits = logits.scatter(1, seen.masked_fill(seen == targets[mask][:, None], 0), float("-inf"))
            loss = F.cross_entropy(logits, targets[mask])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item(), count + 1
        valid = M.retrieval_metrics(rank_rows(model, data.valid, data.max_len, max_len))
        if valid["ndcg@10"] > best["ndcg@10"]:
            best = {"ndcg@10": valid["ndcg@10"], "epoch": epoch,
                    "state": {name: tensor.clone() for name, tensor in model.state_dict().items()}}
        report(f"seed {config.seed} epoch {epoch}: loss {total / max(count, 1):.4f} valid ndcg@10 "
               f"{valid['ndcg@10']:.4f} (best {best['ndcg@10']:.4f} at {best['epoch']})")
        if config.keep_best and epoch - best["epoch"] >= config.patience:
            break
    if config.keep_best:
        model.load_state_dict(best["state"])
    return model, best, round(time.perf_counter() - started, 1)


def mean_std(runs: list[dict]) -> dict[str, tuple[float, float]]:
    """Per metric: mean and sample standard deviation over runs."""
    return {name: (float(np.mean([run[name] for run in runs])), float(np.std([run[name] for run in runs], ddof=1))
                   if len(runs) > 1 else 0.0) for name in METRICS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", default=".")
    parser.add_argument("--table", default="movielens.sequences")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="JSON results file (default: results/sasrec-<table>.json)")
    for name, value in asdict(SASRecConfig()).items():
        if isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=value)
        elif name != "seed":
            kind = {"attention_dropout": float, "max_len": int}.get(name, type(value))
            parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = read_table(args.workspace, args.table)
    print(f"{data.ref}: {len(data.train_sequences)} users, {data.item_vocab_size} item ids, "
          f"{len(training_windows(data.train_sequences, data.max_len))} training windows of {data.max_len + 1}")
    fields = {name: getattr(args, name) for name in asdict(SASRecConfig()) if name != "seed"}
    runs = [train_and_score(data, SASRecConfig(**fields, seed=seed)) for seed in args.seeds]
    summary = mean_std(runs)
    for run in runs:
        print(" ".join(f"{name} {run[name]:.4f}" for name in METRICS), f"(seed {run['seed']}, epoch {run['best_epoch']})")
    print("mean ± std: " + ", ".join(f"{name} {m:.4f} ± {s:.4f}" for name, (m, s) in summary.items()))
    out = args.out or RESULTS / f"sasrec-{data.ref.split('@')[0].replace('.', '-')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"data": data.ref, "config": fields, "runs": runs,
                               "mean_std": {k: list(v) for k, v in summary.items()}}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
