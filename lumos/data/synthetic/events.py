"""Events of one block of users: E events in S sessions; arrays are indexed by event or session."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lumos.data.synthetic.spec import SyntheticSpec
from lumos.data.synthetic.tables import categories, item_ids, take, user_ids
from lumos.data.synthetic.world import COUNTRY_SPEND, DEVICES, Catalog, World, funnel_table

EVENT_TYPES = ("view", "click", "add_to_cart", "purchase")  # index = funnel stage
HOUR_ACTIVITY = np.array(  # UTC hour 0..23: quiet nights, a lunch bump, an evening peak
    [0.3, 0.2, 0.15, 0.1, 0.1, 0.15, 0.3, 0.6, 0.8, 0.9, 1.0, 1.1]
    + [1.3, 1.2, 1.0, 1.0, 1.1, 1.3, 1.7, 2.2, 2.5, 2.4, 1.8, 0.9]
)
SALE_DISCOUNT = 0.85
EXTRA_QUANTITY = 0.25  # mean extra units per purchase, times country spend, times 3 on sale days
MEAN_SESSION_EVENTS = 6.0
MEAN_EVENT_GAP_S = 40.0
MAIN_DEVICE_SHARE = 0.9
SUCCESSOR_PROBABILITY = 0.5
SECONDS_PER_DAY = 86_400

EVENTS_SCHEMA = pa.schema(
    [
        ("user_id", pa.string()),
        ("ts", pa.timestamp("us")),
        ("event_type", pa.string()),
        ("item_id", pa.string()),
        ("category", pa.string()),
        ("device", pa.string()),
        ("value", pa.float64()),
    ]
)


@dataclass(frozen=True)
class _Sessions:
    of_event: np.ndarray  # (E,) session of each event
    first_event: np.ndarray  # (S,) index of each session's first event
    user: np.ndarray  # (S,) block-local user
    start_s: np.ndarray  # (S,) seconds since spec.start, increasing within a user
    device: np.ndarray  # (S,)

    @property
    def day(self) -> np.ndarray:
        return self.start_s // SECONDS_PER_DAY


def _draw_sessions(
    event_user: np.ndarray,
    user_first_event: np.ndarray,
    end_day: np.ndarray,
    main_device: np.ndarray,
    day_activity: np.ndarray,
    rng: np.random.Generator,
) -> _Sessions:
    events = len(event_user)
    starts = rng.random(events) < 1.0 / MEAN_SESSION_EVENTS
    starts[user_first_event] = True
    first_event = np.flatnonzero(starts)
    user = event_user[first_event]
    sessions = len(first_event)
    # Inverse-CDF sampling of the day, truncated at each user's end day.
    day_cdf = np.cumsum(day_activity)
    day = np.searchsorted(day_cdf, rng.random(sessions) * day_cdf[end_day[user] - 1], side="right")
    hour_cdf = np.cumsum(HOUR_ACTIVITY)
    hour = np.searchsorted(hour_cdf, rng.random(sessions) * hour_cdf[-1], side="right")
    start_s = day * SECONDS_PER_DAY + hour * 3600 + rng.integers(0, 3600, sessions)
    # Sessions were cut in event order, so hand out each user's start times in time order.
    span = len(day_activity) * SECONDS_PER_DAY
    offset = user.astype(np.int64) * span
    start_s = np.sort(offset + start_s) - offset
    device = np.where(
        rng.random(sessions) < MAIN_DEVICE_SHARE,
        main_device[user],
        rng.integers(0, len(DEVICES), sessions),
    )
    return _Sessions(
        of_event=np.cumsum(starts) - 1,
        first_event=first_event,
        user=user,
        start_s=start_s,
        device=device,
    )


def _event_seconds(sessions: _Sessions, event_user: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(E,) seconds since spec.start, strictly increasing within each user."""
    events = len(event_user)
    gap = (rng.exponential(MEAN_EVENT_GAP_S, events) + 1.0).astype(np.int64)
    gap[sessions.first_event] = 0
    elapsed = np.cumsum(gap)
    elapsed -= elapsed[sessions.first_event][sessions.of_event]
    seconds = sessions.start_s[sessions.of_event] + elapsed
    # Two sessions of a user can overlap; cummax(t - i) + i puts each event at least a second
    # after the one before, so there are no ties (and so no duplicate rows). The per-user offset
    # `big` keeps the running max from carrying over from one user to the next.
    index = np.arange(events)
    big = int(seconds.max(initial=0)) + events + 1
    key = event_user.astype(np.int64) * big + seconds - index
    return np.maximum.accumulate(key) + index - event_user.astype(np.int64) * big


def _funnel_stages(
    sessions: _Sessions,
    event_kind: np.ndarray,
    event_propensity: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """(E,) funnel stage of each event: 0 view (of a new item) … 3 purchase."""
    events = len(event_kind)
    stage = np.zeros(events, dtype=np.int8)
    if events == 0:
        return stage
    chance = rng.random(events)
    funnel = funnel_table()
    length = np.diff(np.append(sessions.first_event, events))
    order = np.argsort(-length, kind="stable")
    first_event, descending = sessions.first_event[order], -length[order]
    # A stage depends on the stage before it, so step through positions inside a session; each
    # step handles every session that long at once (about 80 steps for millions of sessions).
    for position in range(1, int(-descending[0])):
        live = np.searchsorted(descending, -position, side="left")  # sessions longer than position
        index = first_event[:live] + position
        previous = stage[index - 1]
        step = np.minimum(previous, 2)
        probability = funnel[event_kind[index], step]
        probability = np.where(previous >= 1, probability * event_propensity[index], probability)
        advance = (previous < 3) & (chance[index] < np.minimum(probability, 0.95))
        stage[index] = np.where(advance, previous + 1, 0)
    return stage


def _event_items(
    stage: np.ndarray,
    event_user: np.ndarray,
    user_first_event: np.ndarray,
    taste_cdf: np.ndarray,
    catalog: Catalog,
    rng: np.random.Generator,
) -> np.ndarray:
    """(E,) item of each event: a view picks a new item; the funnel steps after it keep it."""
    chain_first = np.flatnonzero(stage == 0)
    chains = len(chain_first)
    user = event_user[chain_first]
    clusters = taste_cdf.shape[1]
    # Fresh draws for every chain (cheap): category from taste, then item by popularity. Shifting
    # each user's CDF by the user index lets one searchsorted sample every user's own taste.
    flat_taste = (taste_cdf + np.arange(len(taste_cdf))[:, None]).ravel()
    category = np.searchsorted(flat_taste, user + rng.random(chains), side="right") - user * clusters
    category = np.clip(category, 0, clusters - 1)
    position = np.searchsorted(catalog.popularity_cdf, category + rng.random(chains), side="right")
    rank = np.clip(position - catalog.category_start[category], 0, catalog.category_size[category] - 1)
    # A chain that follows its predecessor takes the successor item; a run of k follows after a
    # fresh draw at rank r lands on rank r + k of that category, which vectorizes the recursion.
    follows = rng.random(chains) < SUCCESSOR_PROBABILITY
    is_user_first = np.zeros(len(stage), dtype=bool)
    is_user_first[user_first_event] = True
    follows &= ~is_user_first[chain_first]
    head = np.flatnonzero(~follows)
    run = np.cumsum(~follows) - 1
    steps = np.arange(chains) - head[run]
    category = category[head][run]
    rank = (rank[head][run] + steps) % catalog.category_size[category]
    chain_item = catalog.by_category[catalog.category_start[category] + rank]
    return chain_item[np.cumsum(stage == 0) - 1]


def _purchase_values(
    stage: np.ndarray,
    item: np.ndarray,
    event_sale: np.ndarray,
    event_spend: np.ndarray,
    price: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """(E,) purchase amount for purchases, NaN elsewhere (written as null)."""
    purchase = np.flatnonzero(stage == 3)
    on_sale = event_sale[purchase] == 1
    quantity = 1 + rng.poisson(EXTRA_QUANTITY * event_spend[purchase] * np.where(on_sale, 3.0, 1.0))
    unit_price = price[item[purchase]] * np.where(on_sale, SALE_DISCOUNT, 1.0)
    value = np.full(len(stage), np.nan)
    value[purchase] = np.round(unit_price * quantity * rng.lognormal(0.0, 0.05, len(purchase)), 2)
    return value


def block_events(spec: SyntheticSpec, world: World, users: slice, rng: np.random.Generator) -> pa.Table:
    """The events table of the users in `users`, sorted by user then time."""
    people, calendar = world.population, world.calendar
    counts = people.event_count[users]
    event_user = np.repeat(np.arange(len(counts)), counts)  # block-local user of each event
    user_first_event = np.cumsum(counts) - counts
    sessions = _draw_sessions(
        event_user,
        user_first_event,
        people.end_day[users],
        people.main_device[users],
        calendar.activity[: spec.days],
        rng,
    )
    seconds = _event_seconds(sessions, event_user, rng)
    event_day = sessions.day[sessions.of_event]  # a session's effects follow its start day
    stage = _funnel_stages(
        sessions,
        calendar.day_kind[event_day],
        people.purchase_propensity[users][event_user],
        rng,
    )
    item = _event_items(stage, event_user, user_first_event, people.taste_cdf[users], world.catalog, rng)
    value = _purchase_values(
        stage,
        item,
        calendar.sale[event_day],
        COUNTRY_SPEND[people.country[users]][event_user],
        world.catalog.price,
        rng,
    )
    epoch_s = (spec.start - datetime.date(1970, 1, 1)).days * SECONDS_PER_DAY  # naive UTC
    columns = [
        take(user_ids(spec, users), event_user),
        pa.array((epoch_s + seconds) * 1_000_000, type=pa.timestamp("us")),
        take(pa.array(EVENT_TYPES), stage),
        take(item_ids(spec), item),
        take(categories(spec), world.catalog.category[item]),
        take(pa.array(DEVICES), sessions.device[sessions.of_event]),
        pa.array(value, mask=stage != 3),
    ]
    return pa.Table.from_arrays(columns, schema=EVENTS_SCHEMA)
