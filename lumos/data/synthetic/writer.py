"""`generate_quickstart`: the world once, then the events block by block, then the static files;
every file is written atomically."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lumos.data.synthetic.events import block_events
from lumos.data.synthetic.spec import SyntheticSpec, SyntheticSummary
from lumos.data.synthetic.tables import calendar_csv, static_tables
from lumos.data.synthetic.world import BLOCK_STREAM, make_world


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


def generate_quickstart(out_dir: str | Path, spec: SyntheticSpec | None = None) -> SyntheticSummary:
    """Write events/part-*.parquet, users.parquet, items.parquet, calendar.csv, labels.parquet.

    Files of a previous run in `out_dir` are replaced, and surplus events parts removed.
    """
    spec = spec or SyntheticSpec()
    out = Path(out_dir)
    events_dir = out / "events"
    events_dir.mkdir(parents=True, exist_ok=True)
    world = make_world(spec)
    parts: list[str] = []
    for block, first in enumerate(range(0, spec.users, spec.users_per_file)):
        users = slice(first, min(first + spec.users_per_file, spec.users))
        rng = np.random.default_rng([spec.seed, BLOCK_STREAM, block])
        table = block_events(spec, world, users, rng)
        parts.append(_write_parquet(events_dir / f"part-{block:05d}.parquet", table))
        del table  # free this block before the next one is generated
    # A previous run may have had more blocks, or died between writing and renaming.
    for stale in sorted([*events_dir.glob("part-*.parquet"), *events_dir.glob(".part-*.tmp")]):
        if str(stale) not in parts:
            stale.unlink()
    files = parts + [_write_parquet(out / name, table) for name, table in static_tables(spec, world).items()]
    files.append(_write_text(out / "calendar.csv", calendar_csv(spec, world.calendar)))
    return SyntheticSummary(
        out_dir=str(out),
        users=spec.users,
        events=int(world.population.event_count.sum()),
        items=spec.items,
        files=files,
    )
