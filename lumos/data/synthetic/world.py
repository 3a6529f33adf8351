"""The world, all small (O(days + items + users)): the calendar, the catalog and the population."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lumos.data.synthetic.spec import CHURN_QUIET_DAYS, SyntheticSpec

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
SALE_ACTIVITY = 1.6
HOLIDAY_ACTIVITY = 1.3

FUNNEL_BASE = np.array([0.30, 0.35, 0.45])  # P(view→click), P(click→cart), P(cart→purchase)
FUNNEL_SALE = np.array([1.15, 1.40, 1.40])
FUNNEL_HOLIDAY = np.array([1.10, 1.10, 1.10])
ZIPF_EXPONENT = 1.1
CALENDAR_TAIL_DAYS = 60

# Independent random streams, so that e.g. changing the block size leaves the catalog alone.
CALENDAR_STREAM, CATALOG_STREAM, POPULATION_STREAM, BLOCK_STREAM = range(4)


@dataclass(frozen=True)
class Calendar:
    holiday: np.ndarray  # (D,) int8, D = days + CALENDAR_TAIL_DAYS
    sale: np.ndarray  # (D,) int8
    activity: np.ndarray  # (D,) relative activity of each day

    @property
    def day_kind(self) -> np.ndarray:
        """(D,) 0 plain, 1 sale, 2 holiday, 3 both: the row of `funnel_table()` for each day."""
        return self.sale + 2 * self.holiday


def _make_calendar(spec: SyntheticSpec, rng: np.random.Generator) -> Calendar:
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
    return Calendar(holiday=holiday, sale=sale, activity=activity)


def funnel_table() -> np.ndarray:
    """(4 day kinds, 3 transitions): the probability of each funnel step on each kind of day."""
    return np.stack(
        [FUNNEL_BASE * FUNNEL_SALE**sale * FUNNEL_HOLIDAY**holiday for holiday in (0, 1) for sale in (0, 1)]
    )


@dataclass(frozen=True)
class Catalog:
    category: np.ndarray  # (items,) category of each item id
    price: np.ndarray  # (items,)
    by_category: np.ndarray  # (items,) item ids ordered by (category, popularity rank)
    category_start: np.ndarray  # (clusters,) offset of each category in by_category
    category_size: np.ndarray  # (clusters,)
    popularity_cdf: np.ndarray  # (items,) Zipf CDF within each category, plus the category index


def _make_catalog(spec: SyntheticSpec, rng: np.random.Generator) -> Catalog:
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
    return Catalog(
        category=category,
        price=np.round(price, 2),
        by_category=by_category,
        category_start=start,
        category_size=size,
        popularity_cdf=position_category + cdf,
    )


@dataclass(frozen=True)
class Population:
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


def _make_population(spec: SyntheticSpec, calendar: Calendar, rng: np.random.Generator) -> Population:
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
    return Population(
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
class World:
    calendar: Calendar
    catalog: Catalog
    population: Population


def make_world(spec: SyntheticSpec) -> World:
    calendar = _make_calendar(spec, np.random.default_rng([spec.seed, CALENDAR_STREAM]))
    catalog = _make_catalog(spec, np.random.default_rng([spec.seed, CATALOG_STREAM]))
    population = _make_population(spec, calendar, np.random.default_rng([spec.seed, POPULATION_STREAM]))
    return World(calendar=calendar, catalog=catalog, population=population)
