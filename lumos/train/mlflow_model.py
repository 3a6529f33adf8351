"""A training run's checkpoint as an MLflow model: a pyfunc "from code" over the safetensors files.

MLflow's usual pyfunc pickles a Python object, which ties the model to one Python and library
version and runs arbitrary code on load. This one is a model from code: MLflow stores the file
`mlflow_model_code.py` (which names `LumosPyfunc`) beside the checkpoint's weights, config and
feature spec, and loading runs that file and `load_context`, which rebuilds the model with
`load_model`. Nothing is unpickled, so `mlflow.pyfunc.load_model("models:/NAME@alias")` works
wherever Lumos is installed.

Input: rows of the sequences table (the columns the loader reads; targets may be null), as a
pandas DataFrame. Output: one row per input row with the user embedding and, with the retrieval
head, the top-k item vocabulary ids and scores (history items excluded).
"""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from lumos.data.loader import history_length_order, table_batches
from lumos.train.checkpoint import CONFIG_FILE, FEATURES_FILE, MODEL_FILE, load_model

MODEL_NAME = "model"
"""The logged model's name within its run (runs:/RUN_ID/model)."""
CODE_FILE = Path(__file__).with_name("mlflow_model_code.py")
TOP_K = 10
BATCH_ROWS = 256


class LumosPyfunc(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        self.model, _ = load_model(Path(context.artifacts["checkpoint"]))
        self.model.eval()

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        top_k = int((params or {}).get("top_k", TOP_K))
        table = pa.Table.from_pandas(model_input, preserve_index=False)
        if table.num_rows == 0:
            return pd.DataFrame()
        # Scored shortest history first (a batch is padded to its longest), returned in input order.
        order = history_length_order(table, self.model.features)
        batches = table_batches(table.take(order), self.model.features, BATCH_ROWS, "model input")
        scored = pd.concat([_score(self.model, batch, top_k) for batch in batches], ignore_index=True)
        return scored.set_axis(order).sort_index()


@torch.no_grad()
def _score(model, batch, top_k: int) -> pd.DataFrame:
    output = model(batch)
    columns: dict[str, list] = {"user_embedding": list(output.user_embedding.float().numpy())}
    if output.item_query is not None:
        scores = model.score_items(batch, output).scatter(1, model.history_items(batch), float("-inf"))  # (B, V)
        top = torch.topk(scores, min(top_k, scores.shape[1]), dim=1)
        columns["top_item_ids"] = list(top.indices.numpy().astype(np.int64))
        columns["top_scores"] = list(top.values.float().numpy())
    return pd.DataFrame(columns)


def log_checkpoint_model(run_id: str, checkpoint: Path, example: pd.DataFrame, tracking_uri: str) -> str:
    """Log the checkpoint's model files as MLflow model `model` of run `run_id`, with a signature
    inferred from `example` (a few rows of the training table) and its predictions; returns the
    logged model's URI (models:/<model id>), which promote registers."""
    import shutil
    import tempfile
    import warnings

    from mlflow.models import infer_signature

    example = _widened(example)
    with tempfile.TemporaryDirectory(prefix="lumos-mlflow-model-") as scratch:
        files = Path(scratch) / "checkpoint"
        files.mkdir()
        for name in (MODEL_FILE, CONFIG_FILE, FEATURES_FILE):  # not state.pt: serving needs no optimizer
            shutil.copy2(Path(checkpoint) / name, files / name)
        python_model = LumosPyfunc()
        python_model.load_context(_Context({"checkpoint": str(files)}))
        mlflow.set_tracking_uri(tracking_uri)
        with warnings.catch_warnings(), mlflow.start_run(run_id=run_id, log_system_metrics=False):
            # MLflow hints that integer columns cannot hold missing values: ids and counts never are.
            warnings.filterwarnings("ignore", message=".*integer column", category=UserWarning)
            signature = infer_signature(example, python_model.predict(None, example), params={"top_k": TOP_K})
            info = mlflow.pyfunc.log_model(name=MODEL_NAME, python_model=str(CODE_FILE),
                                           artifacts={"checkpoint": str(files)}, signature=signature,
                                           input_example=example, pip_requirements=[])
    return info.model_uri


def _widened(frame: pd.DataFrame) -> pd.DataFrame:
    """Integers as int64, floats as float64, in scalar and array columns: JSON (how MLflow stores
    the input example and serving requests send rows) has one integer and one float type, so a
    signature that says int32 would refuse the model's own example when it is read back."""
    def widen(value):
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            return value.astype(np.int64)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return value.astype(np.float64)
        return value

    widened = {}
    for name, column in frame.items():
        if column.dtype == object:
            widened[name] = column.map(widen)
        elif column.dtype.kind in "iu":
            widened[name] = column.astype(np.int64)
        elif column.dtype.kind == "f":
            widened[name] = column.astype(np.float64)
        else:
            widened[name] = column
    return pd.DataFrame(widened)


class _Context:
    """The `context` MLflow passes to load_context, for the signature's one local prediction."""

    def __init__(self, artifacts: dict[str, str]):
        self.artifacts = artifacts
