"""Reading ingest sources: Parquet, CSV, JSON or Delta files, or Lumos tables by name.

Each read also returns the exact input version for lineage: a Delta version, or for plain files a
content fingerprint (for files given as URIs, a fingerprint of their listing: paths, sizes and
modification times), so that re-ingesting unchanged data is recognised as the same work and
changed data is not.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageInput
from lumos.core.tables import TABLE_REF, TableRef, read_table, resolve, table_location
from lumos.core.workspace import Workspace, is_uri

MALFORMED = "_malformed_line"
"""Column a CSV or JSON read adds: the raw text of a line that does not parse (null on good lines).
Validation turns it into the malformed_line rule, so a broken line is a reject, never an event."""

SUFFIX_FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json"}


def read_source(spark, workspace: Workspace, location: str, fmt: str, base_dir: Path, key: str,
                content_fingerprint: bool = True):
    """Return (DataFrame, LineageInput) for a recipe location; `key` names the recipe field in errors.
    `content_fingerprint=False` leaves a local file or folder's version empty, for a caller that
    fingerprints it file by file (`files_fingerprint`) instead of rereading every byte."""
    if TABLE_REF.match(location) and not (base_dir / location).exists():
        ref = resolve(spark, workspace, TableRef.parse(location))
        return read_table(spark, workspace, ref), LineageInput("delta", table_location(workspace, ref), ref.version)
    if is_uri(location):
        version = listing_fingerprint(spark, location, key)
        return _read_files(spark, location, fmt if fmt != "auto" else _format_from_name(location, key)), LineageInput(
            "files", location, version
        )
    path = (base_dir / location).resolve()
    if not path.exists():
        raise UsageError(f"{key} = {location!r}: {path} does not exist")
    fmt = fmt if fmt != "auto" else detect_format(path, key)
    if fmt == "delta":
        from delta.tables import DeltaTable

        version = DeltaTable.forPath(spark, str(path)).history(1).collect()[0]["version"]
        frame = spark.read.format("delta").option("versionAsOf", version).load(str(path))
        return frame, LineageInput("delta", str(path), version)
    version = fingerprint(path) if content_fingerprint else ""
    return _read_files(spark, str(path), fmt), LineageInput("files", str(path), version)


def _read_files(spark, location: str | list[str], fmt: str):
    """The files at `location` (a file or folder, or a list of files) in format `fmt`."""
    from pyspark.sql.types import StringType, StructField, StructType

    if fmt == "csv":
        # Everything as strings: validation casts and reports what does not parse. The schema is
        # given (the header's names plus the malformed-line column) so that Spark's PERMISSIVE mode
        # can keep the raw text of a line with the wrong number of fields, such as one whose
        # unterminated quote swallowed the rest of it, instead of shifting or padding its values.
        header = spark.read.option("header", "true").option("inferSchema", "false").csv(location).columns
        schema = StructType([StructField(name, StringType()) for name in header] + [StructField(MALFORMED, StringType())])
        return (spark.read.schema(schema).option("header", "true").option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", MALFORMED).csv(location))
    if fmt == "json":
        # A line that is not a JSON object keeps its text in MALFORMED (the column exists only
        # when some line is malformed).
        return spark.read.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", MALFORMED).json(location)
    return _read_parquet(spark, location)


NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"


def _read_parquet(spark, location: str | list[str]):
    """Parquet, with INT64 TIMESTAMP(NANOS) columns (pandas' default) read as timestamps.

    Spark refuses nanosecond timestamps unless told to read them as longs; those columns (found
    in the first data file's footer) are read so and turned into microsecond timestamps, Spark's
    precision, rounding down.
    """
    from pyspark.sql import functions as F

    locations = [location] if isinstance(location, str) else location
    nanos = _nanosecond_timestamp_columns(spark, locations[0])
    if nanos and spark.conf.get(NANOS_AS_LONG, "false") != "true":
        spark.conf.set(NANOS_AS_LONG, "true")  # a reused session may lack core.spark's setting
    frame = spark.read.parquet(*locations)
    for name in nanos:
        micros = F.floor(F.col(quote_column(name)).cast("decimal(20,0)") / F.lit(1000)).cast("long")
        frame = frame.withColumn(name, F.timestamp_micros(micros))
    return frame


def _nanosecond_timestamp_columns(spark, location: str) -> list[str]:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    files = _data_files(spark, location)
    if not files:
        return []
    footer = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(
        jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(jvm.org.apache.hadoop.fs.Path(files[0].uri), conf)
    )
    try:
        fields = footer.getFooter().getFileMetaData().getSchema().getFields()
        return [field.getName() for field in fields
                if str(field.getLogicalTypeAnnotation()).startswith("TIMESTAMP(NANOS")]
    finally:
        footer.close()


@dataclass(frozen=True)
class DataFile:
    uri: str
    relative: str
    """Path below the location read (the file name when the location is a file)."""
    size: int
    modified_ms: int


def _data_files(spark, location: str) -> list[DataFile]:
    """Every data file at `location` (a file or folder, any Hadoop file system: file://, s3a://,
    hdfs://), sorted by path, skipping Spark's _SUCCESS markers, .crc files and other hidden ones."""
    jvm = spark._jvm
    root = jvm.org.apache.hadoop.fs.Path(location)
    filesystem = root.getFileSystem(spark._jsc.hadoopConfiguration())
    status = filesystem.getFileStatus(root)
    prefix = status.getPath().toString().rstrip("/") + "/"
    found = []
    listing = filesystem.listFiles(root, True)
    while listing.hasNext():
        entry = listing.next()
        uri = entry.getPath().toString()
        relative = uri.removeprefix(prefix) if status.isDirectory() else entry.getPath().getName()
        if any(part.startswith((".", "_")) for part in relative.split("/")):
            continue
        found.append(DataFile(uri, relative, entry.getLen(), entry.getModificationTime()))
    return sorted(found, key=lambda item: item.relative)


def quote_column(name: str) -> str:
    """Backtick-quote a source column name so dots and spaces in it are not parsed as paths."""
    return "`" + name.replace("`", "``") + "`"


def detect_format(path: Path, key: str) -> str:
    if path.is_dir():
        if (path / "_delta_log").is_dir():
            return "delta"
        suffixes = {p.suffix.lower() for p in path.rglob("*") if p.is_file() and not p.name.startswith(("_", "."))}
        formats = {SUFFIX_FORMATS[s] for s in suffixes if s in SUFFIX_FORMATS}
        if len(formats) == 1:
            return formats.pop()
        raise UsageError(f"{key}: cannot tell the format of folder {path} (found {sorted(suffixes)}); set format")
    return _format_from_name(path.name, key)


def _format_from_name(name: str, key: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        raise UsageError(f"{key}: cannot tell the format of {name!r} from its suffix; set format = parquet|csv|json|delta")
    return SUFFIX_FORMATS[suffix]


def listing_fingerprint(spark, location: str, key: str) -> str:
    """sha256 over the path, size and modification time of every data file at a URI (file://,
    s3a://, hdfs://, any Hadoop file system), listed through Spark's JVM without reading the data:
    new, changed or removed files give a new version, so a re-ingest after new data is new work."""
    try:
        files = _data_files(spark, location)
    except Exception as error:  # py4j's error around Hadoop's FileNotFoundException and the like
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"{key} = {location!r} cannot be listed: {message[:300]}") from None
    if not files:
        raise UsageError(f"{key} = {location!r} holds no data files")
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative}\0{file.size}\0{file.modified_ms}\n".encode())
    return "listing:sha256:" + digest.hexdigest()


def fingerprint(path: Path) -> str:
    """sha256 over the names and bytes of a file, or of every data file under a folder."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            relative = file.relative_to(path)
            if any(part.startswith((".", "_")) for part in relative.parts):
                continue  # Spark's _SUCCESS markers and .crc files are not data
            digest.update(str(relative).encode() + b"\0")
        _hash_bytes(file, digest)
    return "sha256:" + digest.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of one file's bytes."""
    return _hash_bytes(path, hashlib.sha256()).hexdigest()


def files_fingerprint(hashes: dict[str, str]) -> str:
    """sha256 over each file's relative path and content hash (`file_sha256`): a folder's version
    that, unlike `fingerprint`'s one stream of every byte, a reader can compute by hashing only the
    files it has not hashed before (nightly inference's events source: `lumos.data.event_files`)."""
    digest = hashlib.sha256()
    for relative in sorted(hashes):
        digest.update(f"{relative}\0{hashes[relative]}\n".encode())
    return "files:sha256:" + digest.hexdigest()


def _hash_bytes(path: Path, digest):
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest


# ---------------------------------------------------------------------------------------------
# Sources that grow by appending: which files a read consumed, and reading only the new ones


def source_files(spark, source: LineageInput) -> dict[str, str] | None:
    """File → its identity (size and modification time; a Delta file's size: Delta never changes
    a file in place) of the events source as `read_source` read it, for a folder of files or a
    local unpartitioned Delta table; None for anything else, which can only be reread whole."""
    from lumos.data.delta_snapshot import open_snapshot

    if source.kind == "files":
        return {item.uri: f"{item.size}:{item.modified_ms}" for item in _data_files(spark, source.uri)}
    if source.kind == "delta" and not is_uri(source.uri):
        try:
            snapshot = open_snapshot(source.uri, int(source.version))
        except UsageError:
            return None  # deletion vectors or column mapping: its files alone are not its rows
        if snapshot.partition_columns:
            return None  # partition values live in the log, not in the files
        return {item.path: str(item.size) for item in snapshot.files}
    return None


def read_source_files(spark, source: LineageInput, fmt: str, files: list[str]):
    """The rows of some of `source_files(source)`'s files, as `read_source` reads the source."""
    if source.kind == "delta":
        return spark.read.parquet(*files)
    if fmt in ("auto", "delta"):
        fmt = detect_format(Path(source.uri), "source.path") if not is_uri(source.uri) else _format_from_name(source.uri, "source.path")
    return _read_files(spark, files, fmt)
