"""Fetch MovieLens-100K and write it as Lumos events: examples/movielens/data/events.parquet.

MovieLens may not be redistributed (GroupLens terms), so nothing here is committed: the ratings
are taken at run time from the `recbole==1.2.1` wheel on PyPI (member
recbole/dataset_example/ml-100k/ml-100k.inter), or from a local copy of the original `u.data`.
Both are checked against one sha256: the .inter file is u.data with a header line, so u.data is
verified as that header plus its bytes.

    python examples/movielens/fetch.py                       # pip download the wheel, extract, convert
    python examples/movielens/fetch.py --u-data ml-100k/u.data
    python examples/movielens/fetch.py --inter ml-100k.inter
    python examples/movielens/fetch.py --wheel recbole-1.2.1-py3-none-any.whl

Every rating becomes one event: user_id, item_id (strings), rating (a float; the token's value),
ts (UTC, from the Unix seconds) and event_type = "rating".
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

INTER_SHA256 = "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff"
INTER_HEADER = b"user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
WHEEL = "recbole==1.2.1"
WHEEL_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
EXPECTED = {"rows": 100_000, "users": 943, "items": 1_682}
EVENTS_FILE = "events.parquet"
EVENTS_SCHEMA = pa.schema([
    ("user_id", pa.string()),
    ("item_id", pa.string()),
    ("rating", pa.float64()),
    ("ts", pa.timestamp("us")),
    ("event_type", pa.string()),
])


class FetchError(Exception):
    """The data could not be obtained or is not the expected MovieLens-100K file."""


def verify_inter(content: bytes, source: str) -> None:
    """Raise FetchError unless `content` is exactly the ml-100k.inter file."""
    digest = hashlib.sha256(content).hexdigest()
    if digest != INTER_SHA256:
        lines = content.count(b"\n")
        raise FetchError(
            f"{source}: checksum mismatch (sha256 {digest}, expected {INTER_SHA256}; {len(content):,} bytes, "
            f"{lines:,} lines, expected 1,979,230 bytes and 100,001 lines). The file is truncated, altered or "
            "not MovieLens-100K; delete it and fetch again"
        )


def inter_from_u_data(content: bytes) -> bytes:
    """The .inter bytes that correspond to the original u.data (the same rows under a header)."""
    return INTER_HEADER + content


def parse_inter(content: bytes) -> pa.Table:
    """Rows of a RecBole .inter file (tab-separated, one header line) as an events table."""
    text = content.decode("utf-8")
    header, _, body = text.partition("\n")
    if header.split("\t")[:4] != ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]:
        raise FetchError(f"not an ml-100k .inter file: unexpected header {header[:80]!r}")
    return _events(body, "inter")


def parse_u_data(content: bytes) -> pa.Table:
    """Rows of the original u.data (tab-separated user, item, rating, Unix seconds; no header)."""
    return _events(content.decode("utf-8"), "u.data")


def _events(body: str, source: str) -> pa.Table:
    users, items, ratings, seconds = [], [], [], []
    for number, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise FetchError(f"{source} line {number}: expected 4 tab-separated fields, got {len(fields)}: {line[:80]!r}")
        try:
            users.append(fields[0])
            items.append(fields[1])
            ratings.append(float(fields[2]))
            seconds.append(int(float(fields[3])))
        except ValueError:
            raise FetchError(f"{source} line {number}: rating and timestamp must be numbers: {line[:80]!r}") from None
    micros = pa.array([second * 1_000_000 for second in seconds], pa.int64()).cast(pa.timestamp("us"))
    return pa.Table.from_arrays(
        [pa.array(users, pa.string()), pa.array(items, pa.string()), pa.array(ratings, pa.float64()), micros,
         pa.array(["rating"] * len(users), pa.string())],
        schema=EVENTS_SCHEMA,
    )


def read_wheel(wheel: Path) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(WHEEL_MEMBER)
    except (zipfile.BadZipFile, KeyError) as error:
        raise FetchError(f"{wheel}: cannot read {WHEEL_MEMBER} ({error}); delete it and download {WHEEL} again") from None


def download_wheel(folder: Path) -> Path:
    """`pip download --no-deps recbole==1.2.1` into `folder`; the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", WHEEL, "-d", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(folder.glob("recbole-1.2.1-*.whl"))
    if done.returncode != 0 or not wheels:
        raise FetchError(f"`{' '.join(command[2:])}` failed:\n{done.stderr.strip()[-2000:]}\n"
                         "Without network access, pass --u-data PATH (the original ml-100k/u.data) or --wheel PATH")
    return wheels[0]


def load_ratings(u_data: Path | None = None, inter: Path | None = None, wheel: Path | None = None) -> pa.Table:
    """The verified ratings as an events table, from whichever source is given (else PyPI)."""
    if u_data is not None:
        content = _read(u_data)
        verify_inter(inter_from_u_data(content), str(u_data))
        return parse_u_data(content)
    if inter is not None:
        content = _read(inter)
    elif wheel is not None:
        content = read_wheel(wheel)
    else:
        with tempfile.TemporaryDirectory(prefix="movielens-") as scratch:
            content = read_wheel(download_wheel(Path(scratch)))
    verify_inter(content, str(inter or wheel or WHEEL))
    return parse_inter(content)


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise FetchError(f"{path} does not exist")
    return path.read_bytes()


def write_events(events: pa.Table, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    target = out / EVENTS_FILE
    staging = out / f".{EVENTS_FILE}.tmp"
    pq.write_table(events, staging)
    staging.replace(target)  # atomic: a half-written file never looks like data
    return target


def fetch(out: Path, u_data: Path | None = None, inter: Path | None = None, wheel: Path | None = None,
          force: bool = False) -> Path:
    target = out / EVENTS_FILE
    if target.exists() and not force:
        return target
    events = load_ratings(u_data, inter, wheel)
    stats = {"rows": events.num_rows, "users": len(set(events["user_id"].to_pylist())),
             "items": len(set(events["item_id"].to_pylist()))}
    if stats != EXPECTED:
        raise FetchError(f"parsed {stats}, expected {EXPECTED}")
    return write_events(events, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--u-data", type=Path, help="the original ml-100k/u.data")
    source.add_argument("--inter", type=Path, help="an ml-100k.inter file")
    source.add_argument("--wheel", type=Path, help="a downloaded recbole-1.2.1 wheel")
    parser.add_argument("--force", action="store_true", help="rewrite events.parquet even if it exists")
    args = parser.parse_args(argv)
    try:
        target = fetch(args.out, args.u_data, args.inter, args.wheel, args.force)
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"MovieLens-100K events: {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
