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

From the command line: `lumos data synth --out /tmp/quickstart --users 2000 --events 200000`.

Modules, in the order of the story: `spec` (the knobs), `world` (calendar, catalog, population),
`events` (sessions, funnel, items, values), `tables` (ids, users, items, labels, calendar) and
`writer` (`generate_quickstart`, which writes the files).
"""

from __future__ import annotations

from typing import Any

from lumos.data.synthetic.spec import SyntheticSpec, SyntheticSummary

__all__ = ["EVENTS_SCHEMA", "SyntheticSpec", "SyntheticSummary", "generate_quickstart"]


def __getattr__(name: str) -> Any:
    # The generators load numpy and pyarrow on first use, so that the CLI can read SyntheticSpec's
    # defaults for its options without slowing down every command.
    if name == "generate_quickstart":
        from lumos.data.synthetic.writer import generate_quickstart

        return generate_quickstart
    if name == "EVENTS_SCHEMA":
        from lumos.data.synthetic.events import EVENTS_SCHEMA

        return EVENTS_SCHEMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
