"""The model: shapes, masking, attention pattern, tied retrieval, losses, learning, safetensors, config."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from lumos.core.config import from_dict
from lumos.core.errors import ConfigError
from lumos.data.contract import Batch, FeatureSpec
from lumos.train.model import Attention, LumosModel, ModelConfig, memory_mask_of, signed_expm1, signed_log1p

FEATURES = FeatureSpec(
    token_categorical={"item": 12, "event_type": 4, "hour": 24},
    token_numeric=("value", "age_days"),
    static_categorical={"user_country": 5},
    static_numeric=("user_tenure",),
    future_flags=("holiday", "sale"),
    horizons_days=(1, 3),
    max_len=32,
)
CONFIG = ModelConfig(
    d_model=8, n_heads=2, encoder_layers=2, decoder_layers=2, d_ff=16, dropout=0.0, max_len=32, negatives=5
)
LENGTHS = (17, 5, 0)  # B = 3, T = 17, and one row with no history at all


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a busy 2-core machine the thread
    hand-offs made the training test 15x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_batch(features: FeatureSpec = FEATURES, lengths=LENGTHS, seed: int = 0) -> Batch:
    """Random right-padded histories; ids are >= 1 at real positions and 0 where padded."""
    generator = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    tokens = {
        name: torch.randint(1, size, (B, T), generator=generator) * mask
        for name, size in features.token_categorical.items()
    }
    numeric = torch.randn(B, T, len(features.token_numeric), generator=generator).exp() * mask[:, :, None]
    H = len(features.horizons_days)
    return Batch(
        tokens=tokens,
        numeric=numeric,
        mask=mask,
        static_categorical={
            name: torch.randint(0, size, (B,), generator=generator)
            for name, size in features.static_categorical.items()
        },
        static_numeric=torch.rand(B, len(features.static_numeric), generator=generator) * 1000,
        future=torch.randint(0, 2, (B, features.future_slots, len(features.future_flags)), generator=generator).float(),
        next_item=torch.randint(2, features.item_vocab_size, (B,), generator=generator),
        act=torch.randint(0, 2, (B, H), generator=generator).float(),
        value=torch.randn(B, H, generator=generator).exp() * 50,
    )


def make_model(config: ModelConfig = CONFIG, seed: int = 0) -> LumosModel:
    torch.manual_seed(seed)
    return LumosModel(config, FEATURES).eval()


def outputs(model: LumosModel, batch: Batch) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(batch)
        return {
            "user_embedding": out.user_embedding,
            "item_query": out.item_query,
            "act_logits": out.act_logits,
            "value_pred": out.value_pred,
            "memory": model.encode(batch)[0],
        }


def test_forward_shapes_at_awkward_sizes_with_an_empty_history():
    model, batch = make_model(), make_batch()
    out = model(batch)
    assert out.user_embedding.shape == (3, 8)
    assert out.item_query.shape == (3, 8)
    assert out.act_logits.shape == (3, 2)
    assert out.value_pred.shape == (3, 2)
    for tensor in (out.user_embedding, out.item_query, out.act_logits, out.value_pred):
        assert torch.isfinite(tensor).all()
    assert torch.equal(model.embed_users(batch), out.user_embedding)
    scores = model.score_items(batch)
    assert scores.shape == (3, 12)
    assert torch.isneginf(scores[:, :2]).all() and torch.isfinite(scores[:, 2:]).all()


@pytest.mark.parametrize("user_token", [True, False])
def test_a_batch_with_no_history_at_all(user_token):
    model = make_model(dataclasses.replace(CONFIG, user_token=user_token))
    assert (model.user_token is not None) == user_token
    batch = make_batch(lengths=(0, 0, 0))  # T = 0: only the user tokens
    batch.next_item.zero_()
    total, losses = model.loss(batch)
    assert model(batch).act_logits.shape == (3, 2)
    assert torch.isfinite(total) and losses["retrieval"].item() == 0.0


HSTU = dataclasses.replace(CONFIG, attention="silu", relative_position_bias=True)


@pytest.mark.parametrize("config", [CONFIG, HSTU], ids=["softmax", "hstu"])
def test_padding_is_never_attended(config):
    model, batch = make_model(config), make_batch()
    before = outputs(model, batch)
    padded = ~batch.mask
    garbage = make_batch(seed=1)
    batch.tokens = {
        name: torch.where(padded, garbage.tokens[name].clamp(min=1), ids) for name, ids in batch.tokens.items()
    }
    batch.numeric = torch.where(padded[:, :, None], torch.full_like(batch.numeric, 1e6), batch.numeric)
    after = outputs(model, batch)
    for name in ("user_embedding", "item_query", "act_logits", "value_pred"):
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=1e-6)
    real = torch.cat([torch.ones(3, 1, dtype=torch.bool), batch.mask], dim=1)  # the user token is always real
    torch.testing.assert_close(after["memory"][real], before["memory"][real], rtol=0, atol=1e-6)


def test_encoder_attention_is_not_causal():
    model, batch = make_model(), make_batch()
    before = outputs(model, batch)["memory"]
    last = LENGTHS[0] - 1
    batch.tokens["item"][0, last] = batch.tokens["item"][0, last] % 11 + 1  # another real item
    after = outputs(model, batch)["memory"]
    first_history_token = 1  # position 0 is the user token
    assert not torch.allclose(after[0, first_history_token], before[0, first_history_token], atol=1e-6)


CAUSAL = dataclasses.replace(CONFIG, encoder_attention="causal", position_targets=True)


@pytest.mark.parametrize("config", [CAUSAL, dataclasses.replace(HSTU, encoder_attention="causal", position_targets=True)],
                         ids=["softmax", "hstu"])
def test_causal_encoder_positions_never_see_later_tokens(config):
    model, batch = make_model(config), make_batch()
    before = outputs(model, batch)["memory"]
    changed = 9  # a real history token of row 0, at encoder position 10
    batch.tokens["item"][0, changed] = batch.tokens["item"][0, changed] % 11 + 1
    batch.numeric[0, changed] += 5.0
    after = outputs(model, batch)["memory"]
    torch.testing.assert_close(after[0, : changed + 1], before[0, : changed + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(after[0, changed + 1], before[0, changed + 1], atol=1e-6)
    torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=1e-6)


def test_hstu_rows_do_not_depend_on_the_batch_they_are_in():
    """The silu attention averages over the keys a query may see, and the relative bias depends
    on distances only: a row scores the same beside a longer row."""
    model = make_model(dataclasses.replace(HSTU, encoder_attention="causal", position_targets=True))
    short, long = make_batch(lengths=(5, 3)), make_batch(lengths=(5, 3, 20), seed=1)
    for name in short.tokens:
        long.tokens[name][:2, :5] = short.tokens[name]
    long.numeric[:2, :5] = short.numeric
    long.static_categorical = {name: torch.cat([ids, ids[:1]]) for name, ids in short.static_categorical.items()}
    long.static_numeric = torch.cat([short.static_numeric, short.static_numeric[:1]])
    long.future = torch.cat([short.future, short.future[:1]])
    alone, beside = outputs(model, short), outputs(model, long)
    for name in ("user_embedding", "item_query"):
        torch.testing.assert_close(beside[name][:2], alone[name], rtol=0, atol=1e-5)


def test_silu_attention_averages_silu_weighted_values_over_the_allowed_keys():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    allowed = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 1]], dtype=torch.bool)[None, None]
    got = Attention._pointwise(q, k, v, allowed, bias=None, dropout=0.0)
    for query in range(3):
        keys = allowed[0, 0, query].nonzero().flatten()
        weights = F.silu(k[0, 0, keys] @ q[0, 0, query] / 2.0)  # not normalized against each other
        torch.testing.assert_close(got[0, 0, query], (weights[:, None] * v[0, 0, keys]).sum(0) / len(keys))
    torch.manual_seed(0)
    attention = Attention(d_model=8, n_heads=2, dropout=0.0, attention_dropout=0.0, kind="silu").eval()
    x = torch.randn(1, 4, 8)
    allowed = torch.tensor([True, True, True, False])[None, None, None, :]
    with torch.no_grad():  # a key that is not allowed is never read
        torch.testing.assert_close(attention(x, x, allowed), attention(x, torch.cat([x[:, :3], 100 * x[:, 3:]], 1), allowed))


def test_no_decoder_makes_the_next_item_slot_the_last_position():
    config = dataclasses.replace(CAUSAL, decoder_layers=0, heads=("retrieval",))
    model, batch = make_model(config), make_batch()
    assert len(model.decoder) == 0
    with torch.no_grad():
        memory, memory_mask = model.encode(batch)
        at_every_position = model.decode_positions(batch, memory, memory_mask)  # (B, S, C)
        at_the_last = at_every_position[torch.arange(3), torch.tensor(LENGTHS)]  # position 1 + length - 1
        torch.testing.assert_close(model(batch).item_query, model.item_projection(at_the_last))
    total, losses = model.loss(batch)
    assert torch.isfinite(total)
    with pytest.raises(ConfigError, match="decoder_layers"):
        from_dict(ModelConfig, {"decoder_layers": 0})


def test_each_position_targets_the_item_that_follows_it():
    model, batch = make_model(CAUSAL), make_batch()
    targets = model.position_targets(batch)  # (B, S) with S = 1 + T
    items = batch.tokens["item"]
    assert targets.shape == (3, 18)
    assert torch.equal(targets[0, :17], items[0]) and targets[0, 17] == batch.next_item[0]
    assert torch.equal(targets[1, :5], items[1, :5]) and targets[1, 5] == batch.next_item[1]
    assert (targets[1, 6:] == 0).all()
    assert targets[2, 0] == batch.next_item[2] and (targets[2, 1:] == 0).all()  # no history: the user token predicts


def test_position_targets_train_the_next_item_slot_at_every_position():
    model = make_model(dataclasses.replace(CAUSAL, dropout=0.1)).train()
    total, losses = model.loss(make_batch())
    assert set(losses) == {"retrieval", "binary", "regression"}
    assert torch.isfinite(total) and losses["retrieval"] > 0
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    # At each row's last real position, the slot is what inference computes: the same query.
    model.eval()
    batch = make_batch()
    with torch.no_grad():
        output = model(batch)
        slots = model.decode_positions(batch, output.memory, memory_mask_of(batch.mask))  # (B, S, C)
        last = batch.mask.sum(1)  # the user token is position 0
        torch.testing.assert_close(model.item_projection(slots[torch.arange(3), last]), output.item_query)


def test_position_targets_need_a_causal_encoder_and_the_retrieval_head():
    with pytest.raises(ConfigError, match="encoder_attention"):
        from_dict(ModelConfig, {"position_targets": True})
    with pytest.raises(ConfigError, match="retrieval head"):
        from_dict(ModelConfig, {"position_targets": True, "encoder_attention": "causal", "heads": ["binary"]})


def test_decoder_slots_attend_to_each_other():
    model, batch = make_model(), make_batch()
    before = outputs(model, batch)
    # Day 3 only feeds the 3-day slot's context; the next-item and 1-day slots read day 1 alone.
    batch.future[:, 2, :] = 1 - batch.future[:, 2, :]
    after = outputs(model, batch)
    assert not torch.allclose(after["item_query"], before["item_query"], atol=1e-6)
    assert not torch.allclose(after["act_logits"][:, 0], before["act_logits"][:, 0], atol=1e-6)
    torch.testing.assert_close(after["memory"], before["memory"], rtol=0, atol=0)


def test_retrieval_head_is_tied_to_the_encoder_item_table():
    model, batch = make_model(), make_batch()
    item_shaped = [name for name, tensor in model.state_dict().items() if tensor.shape == (12, 8)]
    assert item_shaped == ["token_embeddings.item.weight"]
    with torch.no_grad():
        model.item_bias.zero_()
        model.token_embeddings["item"].weight[5] = 0
    scores = model.score_items(batch)
    assert torch.equal(scores[:, 5], torch.zeros(3))
    assert (scores[:, [2, 3, 4, 6]] != 0).all()


def test_scaled_item_embedding_multiplies_only_the_encoder_input():
    scaled = make_model(dataclasses.replace(CONFIG, scale_item_embedding=True))
    plain, batch = make_model(), make_batch()
    with torch.no_grad():
        plain.token_embeddings["item"].weight.mul_(8 ** 0.5)  # sqrt(d_model)
    torch.testing.assert_close(scaled.encode(batch)[0], plain.encode(batch)[0])
    # The scores read the table itself: unscaled, so the two models' scores differ.
    assert not torch.allclose(scaled.score_items(batch)[:, 2:], plain.score_items(batch)[:, 2:])


@pytest.mark.parametrize("retrieval", ["full", "sampled"])
def test_tied_scores_without_projection_or_bias(retrieval):
    config = dataclasses.replace(CONFIG, item_projection=False, item_bias=False, retrieval=retrieval)
    model, batch = make_model(config), make_batch()
    assert not [name for name in model.state_dict() if name.startswith(("item_projection", "item_bias"))]
    output = model(batch)
    torch.testing.assert_close(output.item_query, model.decode(batch, *model.encode(batch))[:, 0])
    scores = model.score_items(batch, output)
    torch.testing.assert_close(scores[:, 2:], output.item_query @ model.item_table[2:].T)
    total, losses = model.train().loss(batch)
    total.backward()
    assert torch.isfinite(losses["retrieval"]) and model.token_embeddings["item"].weight.grad.abs().sum() > 0


def test_seen_items_are_the_history_tokens_before_each_position():
    model, batch = make_model(), make_batch(lengths=(3, 1))
    batch.tokens["item"] = torch.tensor([[5, 7, 9], [3, 8, 8]])  # the second row's 8s are padding
    seen = model.seen_items(batch)  # (B, S, T)
    assert seen[0].tolist() == [[0, 0, 0], [5, 0, 0], [5, 7, 0], [5, 7, 9]]
    assert seen[1].tolist() == [[0, 0, 0], [3, 0, 0], [3, 0, 0], [3, 0, 0]]


def test_excluding_seen_items_is_a_softmax_over_the_rest_and_keeps_the_target():
    model = make_model(dataclasses.replace(CONFIG, exclude_seen_in_loss=True))
    query, target = torch.randn(2, 8), torch.tensor([4, 6])
    seen = torch.tensor([[3, 5, 0], [6, 7, 0]])  # row 1 repeats its target: the target still counts
    logits = query @ model.item_table.T + model.item_bias
    competing = [[2, 4, 6, 7, 8, 9, 10, 11], [2, 3, 4, 5, 6, 8, 9, 10, 11]]
    expected = torch.stack([torch.logsumexp(logits[row, ids], 0) - logits[row, target[row]]
                            for row, ids in enumerate(competing)]).mean()
    torch.testing.assert_close(model.retrieval_loss(query, target, seen), expected)


def test_the_next_item_slot_excludes_the_whole_history():
    config = dataclasses.replace(CONFIG, heads=("retrieval",))
    batch = make_batch(lengths=(3, 2))
    batch.tokens["item"] = torch.tensor([[5, 7, 9], [3, 4, 4]])  # the second row's last 4 is padding
    batch.next_item = torch.tensor([11, 4])
    plain, excluding = make_model(config), make_model(dataclasses.replace(config, exclude_seen_in_loss=True))
    logits = plain.score_items(batch)
    logits[0, [5, 7, 9]] = logits[1, 3] = float("-inf")  # row 1's target 4 is in its history: kept
    torch.testing.assert_close(excluding.loss(batch)[1]["retrieval"], F.cross_entropy(logits, batch.next_item))


def test_position_targets_exclude_only_what_each_position_has_seen():
    config = dataclasses.replace(CONFIG, encoder_attention="causal", position_targets=True, heads=("retrieval",))
    batch = make_batch(lengths=(3,))
    batch.tokens["item"] = torch.tensor([[5, 7, 9]])
    batch.next_item = torch.tensor([11])
    plain, excluding = make_model(config), make_model(dataclasses.replace(config, exclude_seen_in_loss=True))
    memory, mask = plain.encode(batch)
    queries = plain.item_projection(plain.decode_positions(batch, memory, mask))[0]  # (S, C): positions 0..3
    logits = queries @ plain.item_table.T + plain.item_bias
    logits[:, :2] = float("-inf")
    for position, seen in enumerate([[], [5], [5, 7], [5, 7, 9]]):
        logits[position, seen] = float("-inf")
    expected = F.cross_entropy(logits, torch.tensor([5, 7, 9, 11]))
    torch.testing.assert_close(excluding.loss(batch)[1]["retrieval"], expected)


@pytest.mark.parametrize("retrieval", ["full", "sampled"])
def test_retrieval_losses_are_finite_and_backpropagate(retrieval):
    model = make_model(dataclasses.replace(CONFIG, retrieval=retrieval, dropout=0.1)).train()
    total, losses = model.loss(make_batch())
    assert set(losses) == {"retrieval", "binary", "regression"}
    assert torch.isfinite(total) and all(torch.isfinite(loss) for loss in losses.values())
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.token_embeddings["item"].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("retrieval", ["full", "sampled"])
def test_rows_without_a_target_are_excluded_from_retrieval(retrieval):
    model = make_model(dataclasses.replace(CONFIG, retrieval=retrieval))
    query, target = torch.randn(3, 8), torch.tensor([4, 0, 1])  # a target, none, out of vocabulary
    torch.manual_seed(0)  # the same negatives for both calls
    with_excluded = model.retrieval_loss(query, target)
    torch.manual_seed(0)
    alone = model.retrieval_loss(query[:1], target[:1])
    torch.testing.assert_close(with_excluded, alone)

    batch = make_batch()
    batch.next_item = torch.zeros(3, dtype=torch.long)
    total, losses = model.loss(batch)
    assert losses["retrieval"].item() == 0.0
    total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def learnable_batch() -> Batch:
    """Targets follow from the history: the next item repeats the latest one, the act and value
    targets depend on the latest item, the history's length and its summed amounts."""
    batch = make_batch()
    latest = batch.tokens["item"][torch.arange(3), (batch.mask.sum(1) - 1).clamp(min=0)] * batch.mask.any(1)
    batch.next_item = torch.where(latest >= 2, latest, 0)
    batch.act = torch.stack([latest > 5, batch.mask.sum(1) > 10], dim=1).float()
    spend = batch.numeric[:, :, 0].sum(1)
    batch.value = torch.stack([spend, 3 * spend], dim=1)
    return batch


def test_loss_falls_on_a_learnable_batch():
    model, batch = make_model(), learnable_batch()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first_total, first = model.loss(batch)
    for _ in range(50):
        total, losses = model.loss(batch)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    assert total.item() < 0.25 * first_total.item()
    for task in first:
        assert losses[task] < 0.5 * first[task], task


def test_state_dict_round_trips_through_safetensors(tmp_path):
    model, batch = make_model(seed=0), make_batch()
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    rebuilt = make_model(seed=1)
    rebuilt.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    before, after = outputs(model, batch), outputs(rebuilt, batch)
    for name in before:
        assert torch.equal(after[name], before[name]), name


def test_config_problems_are_reported_at_once_with_key_paths():
    with pytest.raises(ConfigError) as caught:
        from_dict(ModelConfig, {"d_model": 10, "n_heads": 4, "heads": ["retrieval", "ranking"], "dropout": 1.0})
    keys = {problem.key for problem in caught.value.problems}
    assert keys == {"d_model", "heads", "dropout"}
    assert "ranking" in str(caught.value)
    with pytest.raises(ConfigError, match="heads"):
        from_dict(ModelConfig, {"heads": []})
    assert from_dict(ModelConfig, {"heads": ["binary"], "retrieval": "sampled"}).heads == ("binary",)
    with pytest.raises(ConfigError, match="exclude_seen_in_loss"):
        from_dict(ModelConfig, {"retrieval": "sampled", "exclude_seen_in_loss": True})


def test_attention_dropout_is_its_own_rate():
    """model.attention_dropout drops attention weights alone; left out, it follows model.dropout."""
    batch = make_batch()
    attention_only = make_model(dataclasses.replace(CONFIG, dropout=0.0, attention_dropout=0.5)).train()
    assert not torch.equal(attention_only.loss(batch)[0], attention_only.loss(batch)[0])
    neither = make_model(dataclasses.replace(CONFIG, dropout=0.0)).train()
    assert torch.equal(neither.loss(batch)[0], neither.loss(batch)[0])
    rates = {module.attention_dropout for module in make_model(dataclasses.replace(CONFIG, dropout=0.3)).modules()
             if isinstance(module, Attention)}
    assert rates == {0.3}
    with pytest.raises(ConfigError, match="attention_dropout"):
        from_dict(ModelConfig, {"attention_dropout": 1.0})


def test_the_model_takes_the_data_max_len_unless_set():
    """model.max_len is declared once, by the data: left out, the positional table has the
    feature spec's max_len (the ingest's tokens.max_len); set, it may be longer."""
    assert ModelConfig().max_len is None and from_dict(ModelConfig, {}).max_len is None
    model = make_model(dataclasses.replace(CONFIG, max_len=None))
    assert model.max_len == FEATURES.max_len and model.position.num_embeddings == FEATURES.max_len
    assert make_model(dataclasses.replace(CONFIG, max_len=40)).position.num_embeddings == 40


def test_model_rejects_features_it_cannot_serve():
    with pytest.raises(ValueError, match="max_len"):
        LumosModel(dataclasses.replace(CONFIG, max_len=16), FEATURES)
    no_horizons = dataclasses.replace(FEATURES, horizons_days=())
    with pytest.raises(ValueError, match="binary"):
        LumosModel(CONFIG, no_horizons)
    model = LumosModel(dataclasses.replace(CONFIG, heads=("retrieval",)), no_horizons)
    assert model.loss(make_batch(no_horizons))[1].keys() == {"retrieval"}


def test_ignored_features_change_nothing_and_must_exist():
    model = LumosModel(dataclasses.replace(CONFIG, ignore_features=("hour", "value")), FEATURES).eval()
    assert "hour" not in model.token_embeddings
    batch, changed = make_batch(), make_batch()
    changed.tokens["hour"] = (changed.tokens["hour"] + 5) % 24 * changed.mask
    changed.numeric[:, :, 0] *= 7  # value
    torch.testing.assert_close(model.score_items(changed), model.score_items(batch))
    changed.numeric[:, :, 1] *= 7  # age_days is still read
    assert not torch.allclose(model.score_items(changed), model.score_items(batch))
    with pytest.raises(ValueError, match="'colour'"):
        LumosModel(dataclasses.replace(CONFIG, ignore_features=("colour",)), FEATURES)
    with pytest.raises(ValueError, match="item feature"):
        LumosModel(dataclasses.replace(CONFIG, ignore_features=("item",)), FEATURES)


def test_signed_log1p_inverts_and_keeps_sign():
    values = torch.tensor([-1e4, -3.0, 0.0, 0.5, 1e6])
    torch.testing.assert_close(signed_expm1(signed_log1p(values)), values)
    assert torch.equal(torch.sign(signed_log1p(values)), torch.sign(values))


def test_time_feature_zero_is_a_real_value_not_padding():
    model = make_model()
    assert model.token_embeddings["item"].padding_idx == 0
    assert torch.equal(model.token_embeddings["item"].weight[0], torch.zeros(8))
    assert model.token_embeddings["hour"].padding_idx is None  # hour 0 is midnight
    assert model.token_embeddings["hour"].weight[0].abs().sum() > 0
