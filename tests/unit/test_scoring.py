"""Inference scoring of one batch: columns per head, history left out of the top-k, no padding ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumos.data.contract import FIRST_TOKEN_ID, FeatureSpec
from lumos.infer.scoring import _recommendable, schema_for, score_batch
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelConfig

FEATURES = FeatureSpec(token_categorical={"item": 9, "hour": 24}, token_numeric=("value",), horizons_days=(7,), max_len=8)


def model() -> LumosModel:
    torch.manual_seed(0)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=8)
    return LumosModel(config, FEATURES).eval()


def test_columns_match_the_output_schema_and_history_is_left_out():
    lumos_model = model()
    batch = synthetic_batch(FEATURES, batch_size=3, seq_len=5, seed=1)
    columns = score_batch(lumos_model, None, batch, top_k=4, exclude_history=True)
    names = set(schema_for(lumos_model).names) - {"user_id", "as_of", "model", "top_items"}
    assert set(columns) == names | {"top_ids"}
    for row, scores, history in zip(columns["top_ids"], columns["top_scores"], batch.tokens["item"], strict=True):
        recommended = row[np.isfinite(scores)]  # a history can leave fewer than k items; the rest are -inf
        assert len(recommended) and not set(recommended.tolist()) & set(history.tolist())
        assert (recommended >= FIRST_TOKEN_ID).all()
    assert ((columns["p_act_7d"] >= 0) & (columns["p_act_7d"] <= 1)).all()
    kept = score_batch(lumos_model, None, batch, top_k=4, exclude_history=False)
    assert not np.array_equal(kept["top_ids"], columns["top_ids"]) or not batch.mask.any()


@pytest.mark.parametrize("exclude_history", [True, False], ids=["history left out", "history kept"])
def test_top_k_is_a_sort_of_the_raw_item_scores_without_reserved_ids_and_history(exclude_history):
    lumos_model = model()
    with torch.no_grad():  # a learned popularity offset, zero at initialization: make it count
        lumos_model.item_bias.copy_(torch.randn(FEATURES.item_vocab_size, generator=torch.Generator().manual_seed(5)))
    batch = synthetic_batch(FEATURES, batch_size=6, seq_len=5, seed=2)
    # Padded positions hold a real id: only the history's real positions may be left out.
    batch.tokens["item"] = torch.where(batch.mask, batch.tokens["item"], 3)
    top_k = 6  # more than some rows have left: their tails are -inf
    columns = score_batch(lumos_model, None, batch, top_k=top_k, exclude_history=exclude_history)

    # The expectation, from the model's raw outputs: query · item table + item bias, in float64.
    with torch.no_grad():
        query = lumos_model(batch).item_query.double().numpy()  # (B, C)
    table = lumos_model.token_embeddings["item"].weight.detach().double().numpy()  # (V, C)
    raw = query @ table.T + lumos_model.item_bias.detach().double().numpy()  # (B, V)
    tokens, mask = batch.tokens["item"].numpy(), batch.mask.numpy()
    for row in range(batch.size):
        history = set(tokens[row][mask[row]].tolist()) if exclude_history else set()
        allowed = np.array([item for item in range(FEATURES.item_vocab_size) if item >= 2 and item not in history])
        expected_ids = allowed[np.argsort(-raw[row, allowed], kind="stable")][:top_k]
        expected_scores = np.full(top_k, -np.inf)
        expected_scores[:len(expected_ids)] = raw[row, expected_ids]
        np.testing.assert_allclose(columns["top_scores"][row], expected_scores, rtol=1e-5, atol=1e-6)
        # Ids where their score is apart from its neighbours' (a near-tie may come in either order).
        gaps = np.diff(expected_scores[:len(expected_ids)])
        apart = np.ones(len(expected_ids), dtype=bool)
        apart[1:] &= np.abs(gaps) > 1e-4
        apart[:-1] &= np.abs(gaps) > 1e-4
        assert columns["top_ids"][row][:len(expected_ids)][apart].tolist() == expected_ids[apart].tolist()
    # The batch tests what it means to: row 0's history leaves fewer than k items, row 1's padding holds an id.
    assert len(set(tokens[0][mask[0]].tolist()) - {0, 1}) > FEATURES.item_vocab_size - 2 - top_k
    assert 3 not in tokens[1][mask[1]] and 3 in tokens[1][~mask[1]]


def test_top_k_beyond_the_recommendable_items_is_trimmed_per_row():
    items = np.array([["a", "b", ""], ["c", "", ""]], dtype=object)
    scores = np.array([[2.0, 1.0, -np.inf], [3.0, -np.inf, -np.inf]], dtype=np.float32)
    kept_items, kept_scores = _recommendable(items, scores)
    assert [list(row) for row in kept_items] == [["a", "b"], ["c"]]
    assert [list(row) for row in kept_scores] == [[2.0, 1.0], [3.0]]
    lumos_model = model()
    columns = score_batch(lumos_model, None, synthetic_batch(FEATURES, 2, 8, seed=3), top_k=50, exclude_history=True)
    assert columns["top_ids"].shape[1] == FEATURES.item_vocab_size  # k is capped at the vocabulary
    assert np.isinf(columns["top_scores"]).any()  # padding, OOV and history sink to -inf, then get trimmed


def test_rows_are_batched_shortest_history_first_each_with_its_own_row():
    import pyarrow as pa

    from lumos.data.loader import by_history_length

    histories = [[2, 3, 4], [5], [], [6, 7], [8]]
    table = pa.table({"user_id": ["a", "b", "c", "d", "e"], "item": histories})
    ordered = by_history_length(table, FEATURES)
    assert ordered.column("user_id").to_pylist() == ["c", "b", "e", "d", "a"]  # ties keep their order
    assert ordered.column("item").to_pylist() == [[], [5], [8], [6, 7], [2, 3, 4]]  # each user keeps its row
    assert by_history_length(table.slice(0, 1), FEATURES).equals(table.slice(0, 1))


def test_the_mlflow_model_scores_length_sorted_but_answers_in_input_order():
    import pandas as pd

    from lumos.train.mlflow_model import LumosPyfunc

    rng = np.random.default_rng(0)
    lengths = [5, 1, 8, 0, 3, 8, 2]
    rows = pd.DataFrame({
        "user_id": [f"u{i}" for i in range(len(lengths))],
        "item": [rng.integers(2, 9, n).tolist() for n in lengths],
        "hour": [rng.integers(0, 24, n).tolist() for n in lengths],
        "value": [rng.random(n).astype(np.float32).tolist() for n in lengths],
        "next_item": [2] * len(lengths), "act_7d": [0] * len(lengths), "value_7d": [0.0] * len(lengths),
    })
    pyfunc = LumosPyfunc()
    pyfunc.model = model()
    together = pyfunc.predict(None, rows)
    assert list(together.index) == list(range(len(lengths)))
    for index in range(len(lengths)):
        alone = pyfunc.predict(None, rows.iloc[[index]])
        np.testing.assert_allclose(together["user_embedding"][index], alone["user_embedding"][0], rtol=1e-5, atol=1e-6)
        assert list(together["top_item_ids"][index]) == list(alone["top_item_ids"][0])
