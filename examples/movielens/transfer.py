"""The transfer table: every MovieLens user_label task, four entries side by side on the same 5
folds of users, each fold scored by the same metric code (lumos.eval.cross_validation):

- bag_of_items: TF-IDF of the user's items before the test rating, logistic regression (the
  task's baseline, as `lumos eval` records it);
- frozen + probe: the pretrained next-item run's user embedding, logistic regression (the task's
  model entry, as `lumos eval` records it);
- fine-tuned: the pretrained run's encoder and a new linear head on its user embedding, trained
  together on the fold's training users;
- scratch: the same model and head from a seeded random start, trained the same way on the task alone.

    python examples/movielens/transfer.py --run RUN_ID      # RUN_ID: a `lumos train` of train.toml

Fine-tuned and scratch train identically: the head is first fitted alone on the starting network's
embeddings (linear probing, then fine-tuning: LP-FT), then everything trains with AdamW (the head at
lr 1e-3, the encoder at each rate of --body-lrs in turn; weight decay 0.01), batches of 32 users, up
to --max-epochs epochs. The epoch kept (the fitted head alone counting as epoch 0), and the encoder's
rate, have the lowest loss on an inner validation fifth of the training users (the test fold is
never seen by any choice). Prints the Markdown table and writes it with every fold's figures to --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.loader import table_batches
from lumos.data.sequences_version import open_sequences
from lumos.eval.cross_validation import encode_targets, fold_metrics, mean_and_std, user_folds
from lumos.eval.embeddings import split_rows
from lumos.eval.kinds.embedding_probe import labelled_rows, read_labels
from lumos.eval.score import score_baseline, score_model
from lumos.eval.tasks import load_tasks
from lumos.train.init_from import match_tensors, resolve_parent
from lumos.train.model import LumosModel

HERE = Path(__file__).resolve().parent
TASKS = ("movielens_gender", "movielens_genres", "movielens_age_band", "movielens_occupation")
PATIENCE, BATCH, LR, WEIGHT_DECAY = 3, 32, 1e-3, 0.01
MAX_EPOCHS = 20
"""The default of --max-epochs; the inner validation usually stops a run before it."""
ENTRIES = ("bag_of_items", "frozen + probe", "fine-tuned", "scratch")


class Classifier(torch.nn.Module):
    """A user model's pooled embedding and a linear head: (B, C) → (B, width) logits."""

    def __init__(self, encoder: LumosModel, width: int):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.d_model, width)

    def forward(self, batch) -> torch.Tensor:
        return self.head(self.encoder.embed_users(batch))


def start_model(pretrained: LumosModel, width: int, seed: int, fine_tune: bool) -> Classifier:
    """The pretrained run's architecture and a new head from `seed`; fine-tuned, every tensor the
    run has under the same name and shape is loaded (a differing shape raises), as --init-from does."""
    torch.manual_seed(seed)
    model = Classifier(LumosModel(pretrained.config, pretrained.features), width)
    if fine_tune:
        parent, child = pretrained.state_dict(), model.encoder.state_dict()
        match = match_tensors(parent, child)
        model.encoder.load_state_dict({name: parent[name] for name in match.loaded}, strict=False)
    return model


def train_and_predict(model: Classifier, rows, fit: np.ndarray, valid: np.ndarray, test: np.ndarray, y: np.ndarray,
                      target: str, spec, seed: int, max_epochs: int, body_lr: float = LR) -> tuple[np.ndarray, float]:
    """(len(test), width) probabilities after training `model` on rows `fit`, the epoch kept being
    the one with the lowest loss on rows `valid`, and that loss. The encoder learns at `body_lr`,
    the head at LR: a pretrained body may want smaller steps than a new head."""
    fit_head(model, rows, fit, y, target, spec)
    optimizer = torch.optim.AdamW([{"params": model.encoder.parameters(), "lr": body_lr},
                                   {"params": model.head.parameters(), "lr": LR}], weight_decay=WEIGHT_DECAY)
    rng = np.random.default_rng(seed)
    best, since_best = copy.deepcopy(model.state_dict()), 0
    best_loss = _valid_loss(model, rows, valid, y, target, spec)  # epoch 0: the fitted head alone
    for _ in range(max_epochs):
        model.train()
        order = fit[rng.permutation(fit.size)]
        for start_row in range(0, order.size, BATCH):
            chosen = order[start_row:start_row + BATCH]
            [batch] = table_batches(rows.take(chosen), spec, chosen.size, "transfer")
            loss = _loss(model(batch), torch.from_numpy(y[chosen]), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        valid_loss = _valid_loss(model, rows, valid, y, target, spec)
        if valid_loss < best_loss:
            best, best_loss, since_best = copy.deepcopy(model.state_dict()), valid_loss, 0
        else:
            since_best += 1
            if since_best >= PATIENCE:
                break
    model.load_state_dict(best)
    logits = torch.from_numpy(_logits(model, rows, test, spec))
    return (torch.softmax(logits, dim=1) if target == "classes" else torch.sigmoid(logits)).numpy(), best_loss


def fit_head(model: Classifier, rows, fit: np.ndarray, y: np.ndarray, target: str, spec, l2: float = 1e-3) -> None:
    """Linear probing before fine-tuning (LP-FT, Kumar et al. 2022): the head is first fitted to
    convergence (L-BFGS, l2 penalty) on the starting network's embeddings of the fit users, so that
    training starts from a fitted head, not a random one that would pull the network's features
    towards noise while it learns."""
    model.eval()
    with torch.no_grad():
        x = torch.cat([model.encoder.embed_users(batch) for batch in table_batches(rows.take(fit), spec, 256, "transfer")])
    labels = torch.from_numpy(y[fit])
    optimizer = torch.optim.LBFGS(model.head.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = _loss(model.head(x), labels, target) + 0.5 * l2 * model.head.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)


def _valid_loss(model: Classifier, rows, valid: np.ndarray, y: np.ndarray, target: str, spec) -> float:
    return float(_loss(torch.from_numpy(_logits(model, rows, valid, spec)), torch.from_numpy(y[valid]), target))


def _loss(logits: torch.Tensor, y: torch.Tensor, target: str) -> torch.Tensor:
    return F.cross_entropy(logits, y) if target == "classes" else F.binary_cross_entropy_with_logits(logits, y.float())


def _logits(model: Classifier, rows, index: np.ndarray, spec) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return torch.cat([model(batch) for batch in table_batches(rows.take(index), spec, 256,
                                                                  "transfer")]).double().numpy()


def trained_entries(task, data, pretrained: LumosModel, max_epochs: int = MAX_EPOCHS,
                    body_lrs: tuple[float, ...] = (LR,)) -> dict[str, dict]:
    """fine-tuned and scratch on the task's folds: {entry: {"metrics": mean and _std, "per_fold": [...],
    "body_lr": the one kept per fold}}. With several `body_lrs`, each fold trains once per rate and
    keeps the one with the lowest inner-validation loss, for both entries alike."""
    spec, labels = task.spec, task.spec.labels
    rows = split_rows(data, spec.split)
    label_of = read_labels(task)
    chosen = labelled_rows(spec, rows["user_id"].to_pylist(), rows["as_of"].to_pylist(), label_of)
    rows = rows.take(chosen)
    users = rows["user_id"].to_pylist()
    y, names = encode_targets([label_of[user] for user in users], labels.target)
    fold = user_folds(users, labels.folds, labels.seed)
    result = {}
    for entry in ("fine-tuned", "scratch"):
        per_fold, kept, losses = [], [], []
        for k in range(labels.folds):
            train = np.flatnonzero(fold != k)
            inner = user_folds([users[i] for i in train], 5, labels.seed + 1) == 0
            tried = {}
            for body_lr in body_lrs:
                model = start_model(pretrained, len(names), labels.seed + k, fine_tune=entry == "fine-tuned")
                tried[body_lr] = train_and_predict(model, rows, train[~inner], train[inner], np.flatnonzero(fold == k), y,
                                                   labels.target, data.spec, labels.seed + k, max_epochs, body_lr)
            kept.append(min(tried, key=lambda body_lr: tried[body_lr][1]))  # the inner validation chooses
            losses.append({f"{body_lr:g}": loss for body_lr, (_, loss) in tried.items()})
            per_fold.append(fold_metrics(y[fold == k], tried[kept[-1]][0], labels.target))
            print(f"{spec.name} {entry} fold {k} (body lr {kept[-1]:g}): {per_fold[-1]}", file=sys.stderr, flush=True)
        result[entry] = {"metrics": mean_and_std(per_fold), "per_fold": per_fold, "body_lr": kept,
                         "inner_valid_loss": losses}
    return result


def transfer_table(workspace_dir: Path, run_id: str, task_names: list[str], max_epochs: int = MAX_EPOCHS,
                   out: Path | None = None, body_lrs: tuple[float, ...] = (LR,)) -> dict[str, dict]:
    """Every task's four entries; written to `out` (JSON) after each task, so a long run keeps what it has."""
    workspace = open_workspace(workspace_dir)
    tasks = load_tasks([HERE / "tasks"])
    pretrained = resolve_parent(workspace, run_id).model.eval()
    table = {}
    for name in task_names:
        task = tasks[name]
        data = open_sequences(workspace, TableRef.parse(task.spec.data))
        _, baseline = score_baseline(task, data)
        frozen = score_model(pretrained, task, data)
        entries = {"bag_of_items": _with_std(baseline), "frozen + probe": _with_std(frozen)}
        trained = trained_entries(task, data, pretrained.cpu(), max_epochs, body_lrs)
        entries |= {entry: value["metrics"] for entry, value in trained.items()}
        table[name] = {"metrics": list(task.spec.metric_names), "entries": entries,
                       "choices": {entry: {"body_lr": value["body_lr"], "inner_valid_loss": value["inner_valid_loss"]}
                                   for entry, value in trained.items()}}
        print(markdown({name: table[name]}), file=sys.stderr, flush=True)
        if out is not None:
            out.write_text(json.dumps({"run": run_id, "max_epochs": max_epochs, "body_lrs": body_lrs, "tasks": table},
                                      indent=2) + "\n",
                           encoding="utf-8")
    return table


def _with_std(scores) -> dict[str, float]:
    return scores.metrics | {f"{name}_std": value for name, value in scores.spread.items()}


def markdown(table: dict[str, dict]) -> str:
    lines = ["| task | metric | " + " | ".join(ENTRIES) + " |", "|---|---|" + "---|" * len(ENTRIES)]
    for name, task in table.items():
        for metric in task["metrics"]:
            cells = [f"{task['entries'][entry][metric]:.3f} ± {task['entries'][entry][metric + '_std']:.3f}"
                     for entry in ENTRIES]
            lines.append(f"| {name.removeprefix('movielens_')} | {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the pretrained next-item run: RUN_ID or NAME@alias")
    parser.add_argument("--workspace", type=Path, default=HERE)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--max-epochs", type=int, default=MAX_EPOCHS, help="of fine-tuned and scratch training")
    parser.add_argument("--body-lrs", type=float, nargs="+", default=[LR],
                        help="encoder learning rates tried per fold (the head's is 1e-3); the inner validation keeps one")
    parser.add_argument("--out", type=Path, default=HERE / "data" / "transfer.json")
    args = parser.parse_args(argv)
    table = transfer_table(args.workspace, args.run, args.tasks, args.max_epochs, args.out, tuple(args.body_lrs))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
