"""Synthetic but learnable user activity, for the quickstart, tests and benchmarks.

The generative story, in the order the code follows it:

1. Calendar. Every day of [start, start + days + 60) has an activity weight: weekends are busier,
   a handful of holidays and a few multi-day sales are busier still. The calendar runs 60 days
   past the data so that models predicting a future horizon have its known context.
2. Catalog. Items are split into `clusters` categories; ids are shuffled, so an id says nothing
   about its category. Within a category popularity is Zipf over a rank, and each item has a
   *successor*: the item one rank further down in the same category (wrapping around).
3. Users. A country shifts activity, spend and device mix; an age bucket shifts which categories
   a user likes and how readily they buy; a longer tenure means more activity and less churn.
   Taste is a Dirichlet over categories concentrated on one or two of them. Activity is
   log-normal (heavy-tailed), so some users have a single event. A `churn_fraction` of users
   churn: they stop on a random day in the second half of the period, at least 14 days before
   its end. Events are shared out so that the total is exactly `events`.
4. Sessions. A user's events are cut into sessions of about 6 events. A session falls on a day
   drawn in proportion to the day's weight (within the user's active window) and at an hour drawn
   from a profile that peaks in the evening; its events are seconds to minutes apart. A session
   uses the user's main device 90% of the time.
5. Funnel. Within a session each event either advances the funnel on the current item
   (view → click → add_to_cart → purchase, each step less likely; likelier on sale days and for
   users disposed to buy) or starts on a new item with a view.
6. Items. A new item is, half the time, the successor of the previous one (so order matters and
   next-item prediction beats popularity); otherwise a fresh draw: category from the user's taste,
   item by popularity within it.
7. Value. A purchase is worth price × quantity × small noise. Sales discount the price but raise
   the quantity, so spend goes up on sale days.

The hidden truths, each user's dominant category and whether they churned, go to labels.parquet
for scoring embedding probes. Everything is vectorized numpy; Python loops run only per block of
users (one events part file each) and per position inside a session. The same spec gives
byte-identical files (with the same pyarrow version).

Run by hand: `python -m lumos.data.synthetic --out /tmp/quickstart --users 2000 --events 200000`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lumos.core.config import InvalidFields, field_docs, require_valid

EVENT_TYPES = ("view", "click", "add_to_cart", "purchase")  # index = funnel stage
DEVICES = ("ios", "android", "web")
COUNTRIES = ("US", "GB", "DE", "FR", "BR", "IN")
COUNTRY_SHARE = np.array([0.34, 0.12, 0.12, 0.10, 0.16, 0.16])
COUNTRY_ACTIVITY = np.array([1.3, 1.1, 1.0, 0.9, 0.8, 0.7])
COUNTRY_SPEND = np.array([1.3, 1.15, 1.1, 1.0, 0.7, 0.5])
COUNTRY_DEVICE_MIX = np.array(  # (countries, devices): share of users whose main device it is
    [
        [0.50, 0.30, 0.20],
        [0.45, 0.35, 0.20],
        [0.30, 0.45, 0.25],
        [0.35, 0.40, 0.25],
        [0.15, 0.70, 0.15],
        [0.10, 0.75, 0.15],
    ]
)
AGE_BUCKETS = ("18-24", "25-34", "35-44", "45-54", "55+")
AGE_SHARE = np.array([0.18, 0.30, 0.24, 0.16, 0.12])
AGE_PURCHASE = np.array([0.7, 1.0, 1.2, 1.1, 0.9])
AGE_FAVOURITE_SHARE = 0.6  # how often a user's main category is one of their age bucket's two

WEEKDAY_ACTIVITY = np.array([0.90, 0.85, 0.90, 0.95, 1.10, 1.35, 1.30])  # Monday first
HOUR_ACTIVITY = np.array(  # UTC hour 0..23: quiet nights, a lunch bump, an evening peak
    [0.3, 0.2, 0.15, 0.1, 0.1, 0.15, 0.3, 0.6, 0.8, 0.9, 1.0, 1.1]
    + [1.3, 1.2, 1.0, 1.0, 1.1, 1.3, 1.7, 2.2, 2.5, 2.4, 1.8, 0.9]
)
SALE_ACTIVITY = 1.6
HOLIDAY_ACTIVITY = 1.3

FUNNEL_BASE = np.array([0.30, 0.35, 0.45])  # P(view→click), P(click→cart), P(cart→purchase)
FUNNEL_SALE = np.array([1.15, 1.40, 1.40])
FUNNEL_HOLIDAY = np.array([1.10, 1.10, 1.10])
SALE_DISCOUNT = 0.85
EXTRA_QUANTITY = 0.25  # mean extra units per purchase, times country spend, times 3 on sale days

MEAN_SESSION_EVENTS = 6.0
MEAN_EVENT_GAP_S = 40.0
MAIN_DEVICE_SHARE = 0.9
SUCCESSOR_PROBABILITY = 0.5
ZIPF_EXPONENT = 1.1
CALENDAR_TAIL_DAYS = 60
CHURN_QUIET_DAYS = 14
SECONDS_PER_DAY = 86_400

# Independent random streams, so that e.g. changing the block size leaves the catalog alone.
_CALENDAR_STREAM, _CATALOG_STREAM, _POPULATION_STREAM, _BLOCK_STREAM = range(4)

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
class SyntheticSpec:
    """Shape of the synthetic world; the same spec always gives the same bytes."""

    users: int = 2000
    """Number of users; every one appears in users.parquet and labels.parquet and has an event."""
    events: int = 200_000
    """Total number of events, hit exactly; shared among users by their activity level."""
    items: int = 500
    """Catalog size."""
    clusters: int = 8
    """Latent taste clusters, which are also the item categories ("c0", "c1", ...)."""
    start: datetime.date = datetime.date(2026, 6, 1)
    """First day of activity; timestamps are naive and mean UTC."""
    days: int = 120
    """Length of the activity period in days; the calendar runs 60 days longer."""
    churn_fraction: float = 0.2
    """Share of users who stop all activity on a random day of the second half of the period."""
    seed: int = 0
    """Random seed; every output file is a function of the whole spec."""
    users_per_file: int = 50_000
    """Users per events part file; one block is generated at a time, which bounds memory (about
    250 bytes per event of a block at peak)."""

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        if self.users < 1:
            problems.append(("users", f"must be at least 1, got {self.users}"))
        if self.events < self.users:
            problems.append(("events", f"must be at least users ({self.users}), since every user has an event"))
        if self.clusters < 1:
            problems.append(("clusters", f"must be at least 1, got {self.clusters}"))
        if self.items < self.clusters:
            problems.append(("items", f"must be at least clusters ({self.clusters})"))
        if not isinstance(self.start, datetime.date):
            problems.append(("start", f"must be a date, got {self.start!r}"))
        if self.days < 2 * CHURN_QUIET_DAYS:
            problems.append(("days", f"must be at least {2 * CHURN_QUIET_DAYS}, got {self.days}"))
        if not 0.0 <= self.churn_fraction <= 1.0:
            problems.append(("churn_fraction", f"must be in [0, 1], got {self.churn_fraction}"))
        if self.seed < 0:
            problems.append(("seed", f"must be non-negative, got {self.seed}"))
        if self.users_per_file < 1:
            problems.append(("users_per_file", f"must be at least 1, got {self.users_per_file}"))
        require_valid(problems)


@dataclass(frozen=True)
class SyntheticSummary:
    """What `generate_quickstart` wrote."""

    out_dir: str
    users: int
    events: int
    items: int
    files: list[str]
    """Every file written, events parts first."""


# ---------------------------------------------------------------------------------------------
# The world: calendar, catalog and population, all small (O(days + items + users))


@dataclass(frozen=True)
class _Calendar:
    holiday: np.ndarray  # (D,) int8, D = days + CALENDAR_TAIL_DAYS
    sale: np.ndarray  # (D,) int8
    activity: np.ndarray  # (D,) relative activity of each day

    @property
    def day_kind(self) -> np.ndarray:
        """(D,) 0 plain, 1 sale, 2 holiday, 3 both: the row of `_funnel_table()` for each day."""
        return self.sale + 2 * self.holiday


def _make_calendar(spec: SyntheticSpec, rng: np.random.Generator) -> _Calendar:
    total = spec.days + CALENDAR_TAIL_DAYS
    holiday = np.zeros(total, dtype=np.int8)
    holiday[rng.choice(total, size=max(3, total // 25), replace=False)] = 1
    # One sale of 2-5 days in each of a few equal stretches, so sales never pile up together.
    sale = np.zeros(total, dtype=np.int8)
    count = max(2, total // 30)
    edges = np.linspace(0, total, count + 1).astype(np.int64)
    lengths = rng.integers(2, 6, count)
    firsts = edges[:-1] + rng.integers(0, np.maximum(1, np.diff(edges) - lengths))
    for first, length in zip(firsts, lengths, strict=True):
        sale[first : first + length] = 1
    weekday = (spec.start.weekday() + np.arange(total)) % 7
    activity = (
        WEEKDAY_ACTIVITY[weekday]
        * np.where(sale == 1, SALE_ACTIVITY, 1.0)
        * np.where(holiday == 1, HOLIDAY_ACTIVITY, 1.0)
    )
    return _Calendar(holiday=holiday, sale=sale, activity=activity)


def _funnel_table() -> np.ndarray:
    """(4 day kinds, 3 transitions): the probability of each funnel step on each kind of day."""
    return np.stack(
        [FUNNEL_BASE * FUNNEL_SALE**sale * FUNNEL_HOLIDAY**holiday for holiday in (0, 1) for sale in (0, 1)]
    )


@dataclass(frozen=True)
class _Catalog:
    category: np.ndarray  # (items,) category of each item id
    price: np.ndarray  # (items,)
    by_category: np.ndarray  # (items,) item ids ordered by (category, popularity rank)
    category_start: np.ndarray  # (clusters,) offset of each category in by_category
    category_size: np.ndarray  # (clusters,)
    popularity_cdf: np.ndarray  # (items,) Zipf CDF within each category, plus the category index


def _make_catalog(spec: SyntheticSpec, rng: np.random.Generator) -> _Catalog:
    items, clusters = spec.items, spec.clusters
    by_category = rng.permutation(items)
    size = np.full(clusters, items // clusters, dtype=np.int64)
    size[: items % clusters] += 1
    start = np.cumsum(size) - size
    position_category = np.repeat(np.arange(clusters), size)
    rank = np.arange(items) - start[position_category]
    weight = (rank + 1.0) ** -ZIPF_EXPONENT
    # Shifting each category's CDF by its index lets one searchsorted sample all categories.
    running = np.cumsum(weight)
    before = (running - weight)[start]
    within = running - before[position_category]
    cdf = within / within[start + size - 1][position_category]
    cdf[start + size - 1] = 1.0
    category = np.empty(items, dtype=np.int64)
    category[by_category] = position_category
    base_price = np.exp(rng.normal(np.log(30.0), 0.8, clusters))
    price = np.maximum(0.99, base_price[category] * np.exp(rng.normal(0.0, 0.4, items)))
    return _Catalog(
        category=category,
        price=np.round(price, 2),
        by_category=by_category,
        category_start=start,
        category_size=size,
        popularity_cdf=position_category + cdf,
    )


@dataclass(frozen=True)
class _Population:
    country: np.ndarray  # (U,) index into COUNTRIES
    age: np.ndarray  # (U,) index into AGE_BUCKETS
    tenure_days: np.ndarray  # (U,) int64
    taste_cdf: np.ndarray  # (U, C) cumulative taste over categories, last column exactly 1
    segment: np.ndarray  # (U,) dominant category
    main_device: np.ndarray  # (U,) index into DEVICES
    purchase_propensity: np.ndarray  # (U,) multiplies the cart and purchase steps
    churned: np.ndarray  # (U,) bool
    end_day: np.ndarray  # (U,) first day without activity (days for non-churners)
    event_count: np.ndarray  # (U,) int64, sums to spec.events


def _draw_taste(age: np.ndarray, clusters: int, rng: np.random.Generator) -> np.ndarray:
    """(U, C) Dirichlet tastes: a main category (often one of the age bucket's two) and a second."""
    users = len(age)
    favourite = (2 * age + rng.integers(0, 2, users)) % clusters
    main = np.where(rng.random(users) < AGE_FAVOURITE_SHARE, favourite, rng.integers(0, clusters, users))
    second = rng.integers(0, clusters, users)
    alpha = np.full((users, clusters), 0.1)
    alpha[np.arange(users), main] += 4.0
    alpha[np.arange(users), second] += 1.5
    # Normalized gammas are Dirichlet draws; rng.dirichlet takes one alpha for all rows.
    taste = rng.gamma(alpha)
    return taste / taste.sum(axis=1, keepdims=True)


def _draw_churn(
    spec: SyntheticSpec, tenure_days: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Exactly round(churn_fraction × users) churners, newer users likelier; and each end day."""
    users = spec.users
    # Gumbel top-k is a weighted sample without replacement, with weight 1 / (1 + tenure in years).
    key = -np.log1p(tenure_days / 365.0) + rng.gumbel(size=users)
    churned = np.zeros(users, dtype=bool)
    churned[np.argsort(-key, kind="stable")[: round(spec.churn_fraction * users)]] = True
    churn_day = rng.integers(spec.days // 2, spec.days - CHURN_QUIET_DAYS + 1, users)
    return churned, np.where(churned, churn_day, spec.days)


def _make_population(spec: SyntheticSpec, calendar: _Calendar, rng: np.random.Generator) -> _Population:
    users = spec.users
    country = rng.choice(len(COUNTRIES), users, p=COUNTRY_SHARE)
    age = rng.choice(len(AGE_BUCKETS), users, p=AGE_SHARE)
    tenure_days = np.minimum(1 + rng.exponential(365.0, users).astype(np.int64), 3650)
    taste = _draw_taste(age, spec.clusters, rng)
    taste_cdf = np.cumsum(taste, axis=1)
    taste_cdf[:, -1] = 1.0
    device_cdf = np.cumsum(COUNTRY_DEVICE_MIX, axis=1)[country]  # (U, devices)
    main_device = np.minimum((rng.random(users)[:, None] >= device_cdf).sum(axis=1), len(DEVICES) - 1)
    propensity = AGE_PURCHASE[age] * np.sqrt(COUNTRY_SPEND[country]) * rng.lognormal(0.0, 0.5, users)
    churned, end_day = _draw_churn(spec, tenure_days, rng)
    # A churner's share of events shrinks with their window, so churn does not concentrate activity.
    day_cdf = np.cumsum(calendar.activity[: spec.days])
    window_share = day_cdf[end_day - 1] / day_cdf[-1]
    tenure_factor = 0.7 + 0.6 * np.minimum(tenure_days / 730.0, 1.0)
    activity = rng.lognormal(0.0, 1.0, users) * COUNTRY_ACTIVITY[country] * tenure_factor
    weight = activity * window_share
    event_count = 1 + rng.multinomial(spec.events - users, weight / weight.sum())
    return _Population(
        country=country,
        age=age,
        tenure_days=tenure_days,
        taste_cdf=taste_cdf,
        segment=taste.argmax(axis=1),
        main_device=main_device,
        purchase_propensity=propensity,
        churned=churned,
        end_day=end_day,
        event_count=event_count.astype(np.int64),
    )


@dataclass(frozen=True)
class _World:
    calendar: _Calendar
    catalog: _Catalog
    population: _Population


def _make_world(spec: SyntheticSpec) -> _World:
    calendar = _make_calendar(spec, np.random.default_rng([spec.seed, _CALENDAR_STREAM]))
    catalog = _make_catalog(spec, np.random.default_rng([spec.seed, _CATALOG_STREAM]))
    population = _make_population(spec, calendar, np.random.default_rng([spec.seed, _POPULATION_STREAM]))
    return _World(calendar=calendar, catalog=catalog, population=population)


# ---------------------------------------------------------------------------------------------
# Events of one block of users: E events in S sessions; arrays are indexed by event or session


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
    funnel = _funnel_table()
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
    catalog: _Catalog,
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


def _block_events(spec: SyntheticSpec, world: _World, users: slice, rng: np.random.Generator) -> pa.Table:
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
        _take(_user_ids(spec, users), event_user),
        pa.array((epoch_s + seconds) * 1_000_000, type=pa.timestamp("us")),
        _take(pa.array(EVENT_TYPES), stage),
        _take(_item_ids(spec), item),
        _take(_categories(spec), world.catalog.category[item]),
        _take(pa.array(DEVICES), sessions.device[sessions.of_event]),
        pa.array(value, mask=stage != 3),
    ]
    return pa.Table.from_arrays(columns, schema=EVENTS_SCHEMA)


# ---------------------------------------------------------------------------------------------
# Tables and files


def _user_ids(spec: SyntheticSpec, users: slice = slice(None)) -> pa.Array:
    width = max(7, len(str(spec.users - 1)))
    return pa.array([f"u{number:0{width}d}" for number in range(spec.users)[users]], pa.string())


def _item_ids(spec: SyntheticSpec) -> pa.Array:
    width = max(5, len(str(spec.items - 1)))
    return pa.array([f"i{number:0{width}d}" for number in range(spec.items)], pa.string())


def _categories(spec: SyntheticSpec) -> pa.Array:
    return pa.array([f"c{category}" for category in range(spec.clusters)], pa.string())


def _take(labels: pa.Array, codes: np.ndarray) -> pa.Array:
    """Plain strings from codes (not a dictionary column, so every reader sees `string`)."""
    return labels.take(pa.array(codes, type=pa.int64()))


def _static_tables(spec: SyntheticSpec, world: _World) -> dict[str, pa.Table]:
    """users.parquet, items.parquet and labels.parquet (the hidden truths), by file name."""
    people, catalog = world.population, world.catalog
    users = {
        "user_id": _user_ids(spec),
        "country": _take(pa.array(COUNTRIES), people.country),
        "age_bucket": _take(pa.array(AGE_BUCKETS), people.age),
        "tenure_days": pa.array(people.tenure_days, pa.int64()),
    }
    items = {
        "item_id": _item_ids(spec),
        "category": _take(_categories(spec), catalog.category),
        "price": pa.array(catalog.price, pa.float64()),
    }
    labels = {
        "user_id": _user_ids(spec),
        "segment": _take(_categories(spec), people.segment),
        "churned": pa.array(people.churned, pa.bool_()),
    }
    return {
        "users.parquet": pa.table(users),
        "items.parquet": pa.table(items),
        "labels.parquet": pa.table(labels),
    }


def _calendar_csv(spec: SyntheticSpec, calendar: _Calendar) -> str:
    lines = ["date,holiday,sale"]
    for offset, (holiday, sale) in enumerate(zip(calendar.holiday, calendar.sale, strict=True)):
        day = spec.start + datetime.timedelta(days=offset)
        lines.append(f"{day.isoformat()},{holiday},{sale}")
    return "\n".join(lines) + "\n"


def _write_atomically(path: Path, write: Callable[[Path], None]) -> str:
    """Write through a hidden temporary name, then rename, so no half-written file is visible."""
    temporary = path.with_name(f".{path.name}.tmp")  # dot-prefixed: dataset readers skip it
    write(temporary)
    os.replace(temporary, path)
    return str(path)


def _write_parquet(path: Path, table: pa.Table) -> str:
    return _write_atomically(path, lambda target: pq.write_table(table, target))


def _write_text(path: Path, text: str) -> str:
    return _write_atomically(path, lambda target: target.write_text(text, encoding="utf-8"))


def generate_quickstart(out_dir: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> SyntheticSummary:
    """Write events/part-*.parquet, users.parquet, items.parquet, calendar.csv, labels.parquet.

    Files of a previous run in `out_dir` are replaced, and surplus events parts removed.
    """
    out = Path(out_dir)
    events_dir = out / "events"
    events_dir.mkdir(parents=True, exist_ok=True)
    world = _make_world(spec)
    parts: list[str] = []
    for block, first in enumerate(range(0, spec.users, spec.users_per_file)):
        users = slice(first, min(first + spec.users_per_file, spec.users))
        rng = np.random.default_rng([spec.seed, _BLOCK_STREAM, block])
        table = _block_events(spec, world, users, rng)
        parts.append(_write_parquet(events_dir / f"part-{block:05d}.parquet", table))
        del table  # free this block before the next one is generated
    # A previous run may have had more blocks, or died between writing and renaming.
    for stale in sorted([*events_dir.glob("part-*.parquet"), *events_dir.glob(".part-*.tmp")]):
        if str(stale) not in parts:
            stale.unlink()
    files = parts + [_write_parquet(out / name, table) for name, table in _static_tables(spec, world).items()]
    files.append(_write_text(out / "calendar.csv", _calendar_csv(spec, world.calendar)))
    return SyntheticSummary(
        out_dir=str(out),
        users=spec.users,
        events=int(world.population.event_count.sum()),
        items=spec.items,
        files=files,
    )


# ---------------------------------------------------------------------------------------------
# Command line

_ARGUMENT_TYPES: dict[str, Callable[[str], object]] = {
    "int": int,
    "float": float,
    "datetime.date": datetime.date.fromisoformat,
}


def main(argv: list[str] | None = None) -> int:
    """`python -m lumos.data.synthetic --out DIR [--users N] [--events N] [--seed S] ...`"""
    parser = argparse.ArgumentParser(
        prog="python -m lumos.data.synthetic",
        description="Write a synthetic, learnable user-activity dataset (see the module docstring).",
    )
    parser.add_argument("--out", required=True, help="output directory; a previous run is replaced")
    docs = field_docs(SyntheticSpec)
    for field in dataclasses.fields(SyntheticSpec):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=_ARGUMENT_TYPES[str(field.type)],
            default=field.default,
            help=f"{docs.get(field.name, '')} (default: %(default)s)",
        )
    args = parser.parse_args(argv)
    try:
        spec = SyntheticSpec(**{field.name: getattr(args, field.name) for field in dataclasses.fields(SyntheticSpec)})
    except InvalidFields as error:
        parser.error(str(error))
    began = time.perf_counter()
    summary = generate_quickstart(args.out, spec)
    parts = sum(1 for path in summary.files if "/events/" in path.replace(os.sep, "/"))
    print(
        f"wrote {summary.events:,} events of {summary.users:,} users on {summary.items:,} items "
        f"to {summary.out_dir} ({parts} events part file{'s' if parts != 1 else ''}) "
        f"in {time.perf_counter() - began:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
