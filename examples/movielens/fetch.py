"""Fetch MovieLens-100K and write it for Lumos: examples/movielens/data/events.parquet, items.parquet, users.parquet.

MovieLens may not be redistributed (GroupLens terms), so nothing here is committed: the files are
taken at run time from the `recbole==1.2.1` wheel on PyPI (members
recbole/dataset_example/ml-100k/ml-100k.inter, .item and .user), each checked against a pinned
sha256. The ratings may come from a local copy of the original `u.data` instead: the .inter file
is u.data with a header line, so u.data is verified as that header plus its bytes.

    python examples/movielens/fetch.py                       # pip download the wheel, extract, convert
    python examples/movielens/fetch.py --wheel recbole-1.2.1-py3-none-any.whl
    python examples/movielens/fetch.py --u-data ml-100k/u.data --item ml-100k.item --user ml-100k.user
    python examples/movielens/fetch.py --inter ml-100k.inter    # items and users from the wheel (PyPI)

Every rating becomes one event: user_id, item_id (strings), rating (a float; the token's value),
ts (UTC, from the Unix seconds) and event_type = "rating". Every movie becomes one item row:
item_id, genres (the .item file's `class`: space-separated, e.g. "Action Comedy") and
release_year (null where the file says "unkonwn", sic). Every user one users row: user_id, age
(an integer), gender and occupation (the zip code is left out).
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
ITEM_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.item"
USER_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.user"
ITEM_SHA256 = "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532"
USER_SHA256 = "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972"
ITEM_HEADER = ["item_id:token", "movie_title:token_seq", "release_year:token", "class:token_seq"]
USER_HEADER = ["user_id:token", "age:token", "gender:token", "occupation:token", "zip_code:token"]
EXPECTED = {"rows": 100_000, "users": 943, "items": 1_682}
EXPECTED_ROWS = {"items": 1_682, "users": 943}
"""Rows of items.parquet and users.parquet: one per movie and per user of the ratings."""
EVENTS_FILE = "events.parquet"
ITEMS_FILE = "items.parquet"
USERS_FILE = "users.parquet"
EVENTS_SCHEMA = pa.schema([
    ("user_id", pa.string()),
    ("item_id", pa.string()),
    ("rating", pa.float64()),
    ("ts", pa.timestamp("us")),
    ("event_type", pa.string()),
])
ITEMS_SCHEMA = pa.schema([("item_id", pa.string()), ("genres", pa.string()), ("release_year", pa.int64())])
USERS_SCHEMA = pa.schema([("user_id", pa.string()), ("age", pa.int64()), ("gender", pa.string()),
                          ("occupation", pa.string())])


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


def verify_member(content: bytes, expected_sha256: str, source: str) -> None:
    """Raise FetchError unless `content` has the pinned sha256 of its wheel member (.item, .user)."""
    digest = hashlib.sha256(content).hexdigest()
    if digest != expected_sha256:
        raise FetchError(f"{source}: checksum mismatch (sha256 {digest}, expected {expected_sha256}; "
                         f"{len(content):,} bytes). The file is truncated, altered or not MovieLens-100K's; "
                         "delete it and fetch again")


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


def parse_item(content: bytes) -> pa.Table:
    """Rows of ml-100k.item (tab-separated: id, title, release year, space-separated genres)."""
    rows = _tab_rows(content, ITEM_HEADER, "ml-100k.item")
    years = [int(year) if year.isdigit() else None for _, _, year, _ in rows]  # one movie: "unkonwn"
    return pa.Table.from_arrays([pa.array([row[0] for row in rows], pa.string()),
                                 pa.array([row[3] for row in rows], pa.string()), pa.array(years, pa.int64())],
                                schema=ITEMS_SCHEMA)


def parse_user(content: bytes) -> pa.Table:
    """Rows of ml-100k.user (tab-separated: id, age, gender, occupation, zip code)."""
    rows = _tab_rows(content, USER_HEADER, "ml-100k.user")
    try:
        ages = [int(row[1]) for row in rows]
    except ValueError:
        raise FetchError("ml-100k.user: every age must be an integer") from None
    return pa.Table.from_arrays([pa.array([row[0] for row in rows], pa.string()), pa.array(ages, pa.int64()),
                                 pa.array([row[2] for row in rows], pa.string()),
                                 pa.array([row[3] for row in rows], pa.string())], schema=USERS_SCHEMA)


def _tab_rows(content: bytes, header: list[str], source: str) -> list[list[str]]:
    lines = content.decode("utf-8").splitlines()
    if not lines or lines[0].split("\t") != header:
        raise FetchError(f"{source}: unexpected header {lines[0][:80] if lines else ''!r}")
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise FetchError(f"{source} line {number}: expected {len(header)} tab-separated fields, got {len(row)}")
    return rows


def read_wheel(wheel: Path, member: str = WHEEL_MEMBER) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (zipfile.BadZipFile, KeyError) as error:
        raise FetchError(f"{wheel}: cannot read {member} ({error}); delete it and download {WHEEL} again") from None


def download_wheel(folder: Path) -> Path:
    """`pip download --no-deps recbole==1.2.1` into `folder`; the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", WHEEL, "-d", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(folder.glob("recbole-1.2.1-*.whl"))
    if done.returncode != 0 or not wheels:
        raise FetchError(f"`{' '.join(command[2:])}` failed:\n{done.stderr.strip()[-2000:]}\n"
                         "Without network access, pass --wheel PATH, or --u-data PATH (the original "
                         "ml-100k/u.data) with --item PATH and --user PATH (ml-100k.item and ml-100k.user)")
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


def load_attributes(item: Path | None, user: Path | None, wheel: Path | None) -> tuple[pa.Table, pa.Table]:
    """The verified items and users tables, each from its file if given, else from the wheel."""
    tables = []
    for path, member, expected, parse in ((item, ITEM_MEMBER, ITEM_SHA256, parse_item),
                                          (user, USER_MEMBER, USER_SHA256, parse_user)):
        content = _read(path) if path is not None else read_wheel(wheel, member)
        verify_member(content, expected, str(path or f"{wheel}:{member}"))
        tables.append(parse(content))
    return tables[0], tables[1]


def write_events(events: pa.Table, out: Path, name: str = EVENTS_FILE) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    target = out / name
    staging = out / f".{name}.tmp"
    pq.write_table(events, staging)
    staging.replace(target)  # atomic: a half-written file never looks like data
    return target


def fetch(out: Path, u_data: Path | None = None, inter: Path | None = None, wheel: Path | None = None,
          force: bool = False, item: Path | None = None, user: Path | None = None) -> Path:
    """Write events.parquet, items.parquet and users.parquet into `out` (kept when all three are
    there, unless `force`); the events file's path. The wheel is downloaded only when some file
    has no other source given."""
    target = out / EVENTS_FILE
    if all((out / name).exists() for name in (EVENTS_FILE, ITEMS_FILE, USERS_FILE)) and not force:
        return target
    with tempfile.TemporaryDirectory(prefix="movielens-") as scratch:
        ratings_given = u_data is not None or inter is not None
        if wheel is None and not (ratings_given and item is not None and user is not None):
            wheel = download_wheel(Path(scratch))
        events = load_ratings(u_data, inter, wheel)
        items, users = load_attributes(item, user, wheel)
    stats = {"rows": events.num_rows, "users": len(set(events["user_id"].to_pylist())),
             "items": len(set(events["item_id"].to_pylist()))}
    if stats != EXPECTED:
        raise FetchError(f"parsed {stats}, expected {EXPECTED}")
    rows = {"items": items.num_rows, "users": users.num_rows}
    if rows != EXPECTED_ROWS:
        raise FetchError(f"parsed {rows} rows of items and users, expected {EXPECTED_ROWS}")
    write_events(items, out, ITEMS_FILE)
    write_events(users, out, USERS_FILE)
    return write_events(events, out)  # last: its presence beside the others marks a complete fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--u-data", type=Path, help="the original ml-100k/u.data")
    source.add_argument("--inter", type=Path, help="an ml-100k.inter file")
    source.add_argument("--wheel", type=Path, help="a downloaded recbole-1.2.1 wheel")
    parser.add_argument("--item", type=Path, help="an ml-100k.item file (else from the wheel)")
    parser.add_argument("--user", type=Path, help="an ml-100k.user file (else from the wheel)")
    parser.add_argument("--force", action="store_true", help="rewrite the files even if they exist")
    args = parser.parse_args(argv)
    try:
        target = fetch(args.out, args.u_data, args.inter, args.wheel, args.force, args.item, args.user)
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"MovieLens-100K events, items and users: {target.parent}/{{{EVENTS_FILE},{ITEMS_FILE},{USERS_FILE}}}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
