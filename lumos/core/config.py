"""Frozen-dataclass configs loaded strictly from TOML.

Every stage config is a frozen dataclass whose defaults live only in the class. Loading walks the
schema and the TOML together and collects *every* problem (unknown key with a did-you-mean, wrong
type, missing required field, invalid value from a `__post_init__` check) before raising one
`ConfigError` that names the file and each key path.

`--set a.b=value` overrides are merged into the raw TOML before checking, so an override is checked
exactly like the file. The resolved config is what gets hashed and logged.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import difflib
import functools
import hashlib
import inspect
import json
import math
import re
import textwrap
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from lumos.core.errors import ConfigError, Problem, UsageError

T = TypeVar("T")


class InvalidFields(ValueError):
    """Raised from a `__post_init__` with every cross-field problem it found."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{key}: {message}" for key, message in problems))


def require_valid(problems: list[tuple[str, str]]) -> None:
    """Raise all `(field, message)` problems at once; call it at the end of `__post_init__`."""
    if problems:
        raise InvalidFields(problems)


# ---------------------------------------------------------------------------------------------
# Loading


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file, turning a missing or malformed file into a usage error naming it."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such config file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not valid TOML: {error}") from None


def load_config(schema: type[T], path: str | Path, overrides: typing.Sequence[str] = ()) -> T:
    """Load `schema` from the TOML file at `path`, then apply `--set` overrides."""
    return from_dict(schema, read_toml(path), source=str(path), overrides=overrides)


def from_dict(
    schema: type[T],
    data: dict[str, Any],
    source: str = "<config>",
    overrides: typing.Sequence[str] = (),
) -> T:
    """Build `schema` from plain data, reporting every problem in one `ConfigError`."""
    problems: list[Problem] = []
    data = apply_overrides(schema, data, overrides, problems)
    result = _convert(schema, data, "", problems)
    if problems:
        label = f"{source} (with --set overrides)" if overrides else source
        raise ConfigError(label, problems)
    return result


def apply_overrides(
    schema: type, data: dict[str, Any], overrides: typing.Sequence[str], problems: list[Problem]
) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b=value` written in, parsed by the field's type."""
    merged = _deep_copy(data)  # never write into the caller's dict
    for override in overrides:
        key, sep, raw = override.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem(f"--set {override}", "expected KEY=VALUE, e.g. spark.master=local[2]"))
            continue
        field_type = _field_type_at(schema, key.split("."), problems, key)
        if field_type is None:
            continue
        target = merged
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                problems.append(Problem(key, f"cannot set inside {part!r}, which is not a table"))
                break
        else:
            target[leaf] = _parse_override_value(field_type, raw.strip())
    return merged


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value


def _field_type_at(schema: type, parts: list[str], problems: list[Problem], key: str) -> Any:
    """The annotated type at a dotted path through nested dataclasses, or None (problem noted)."""
    current: Any = schema
    for depth, part in enumerate(parts):
        current = _strip_optional(current)
        if not dataclasses.is_dataclass(current):
            problems.append(Problem(key, f"{'.'.join(parts[:depth])} has no sub-keys"))
            return None
        hints = _type_hints(current)
        if part not in hints:
            problems.append(Problem(key, "unknown key" + _did_you_mean(part, hints)))
            return None
        current = hints[part]
    return current


def _parse_override_value(field_type: Any, raw: str) -> Any:
    """Strings stay raw (no quoting needed on the shell); anything else is read as a TOML value."""
    base = _strip_optional(field_type)
    literal_strings = typing.get_origin(base) is typing.Literal and all(
        isinstance(arg, str) for arg in typing.get_args(base)
    )
    if base in (str, datetime.date, datetime.datetime) or literal_strings:
        return raw
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw  # the type check reports it with the expected type


def _convert(tp: Any, value: Any, path: str, problems: list[Problem]) -> Any:
    """Check `value` against type `tp`, returning the converted value (or None after a problem)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, path, problems)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        arms = [arm for arm in args if arm is not type(None)]
        for arm in arms:
            attempt: list[Problem] = []
            converted = _convert(arm, value, path, attempt)
            if not attempt:
                return converted
        if len(arms) == 1:
            return _convert(arms[0], value, path, problems)
        problems.append(Problem(path, f"expected {_describe(tp)}, got {_show(value)}"))
        return None
    if origin is typing.Literal:
        if value in args:
            return value
        choices = ", ".join(repr(arg) for arg in args)
        problems.append(Problem(path, f"must be one of {choices}, got {_show(value)}"))
        return None
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            problems.append(Problem(path, f"expected a list, got {_show(value)}"))
            return None
        item_type = args[0] if args else Any
        items = [_convert(item_type, item, f"{path}[{i}]", problems) for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(Problem(path, f"expected a table, got {_show(value)}"))
            return None
        value_type = args[1] if len(args) == 2 else Any
        return {key: _convert(value_type, item, _join(path, key), problems) for key, item in value.items()}
    return _convert_scalar(tp, value, path, problems)


def _convert_scalar(tp: Any, value: Any, path: str, problems: list[Problem]) -> Any:
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is datetime.date:
        if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
            return value
        if isinstance(value, str):
            try:
                return datetime.date.fromisoformat(value)
            except ValueError:
                pass
    elif tp is datetime.datetime:
        if isinstance(value, datetime.datetime):
            return value
        if isinstance(value, datetime.date):
            return datetime.datetime.combine(value, datetime.time())
        if isinstance(value, str):
            try:
                return datetime.datetime.fromisoformat(value)
            except ValueError:
                pass
    else:
        raise TypeError(f"config schemas may not use the type {tp!r} (at {path})")
    problems.append(Problem(path, f"expected {_describe(tp)}, got {_show(value)}"))
    return None


def _convert_dataclass(schema: Any, value: Any, path: str, problems: list[Problem]) -> Any:
    if not isinstance(value, dict):
        problems.append(Problem(path, f"expected a table, got {_show(value)}"))
        return None
    hints = _type_hints(schema)
    for key in value:
        if key not in hints:
            problems.append(Problem(_join(path, key), "unknown key" + _did_you_mean(key, hints)))
    kwargs: dict[str, Any] = {}
    missing = False
    before = len(problems)
    for field in dataclasses.fields(schema):
        if field.name in value:
            kwargs[field.name] = _convert(hints[field.name], value[field.name], _join(path, field.name), problems)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            problems.append(Problem(_join(path, field.name), "required key is missing"))
            missing = True
    if missing or len(problems) > before:
        return None  # cross-field checks would only repeat or confuse the problems above
    try:
        return schema(**kwargs)
    except InvalidFields as error:
        problems.extend(Problem(_join(path, key), message) for key, message in error.problems)
    except (ValueError, TypeError) as error:
        problems.append(Problem(path, str(error)))
    return None


@functools.cache
def _type_hints(schema: type) -> dict[str, Any]:
    hints = typing.get_type_hints(schema)  # resolves the string annotations of `from __future__`
    return {f.name: hints[f.name] for f in dataclasses.fields(schema)}


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        arms = [arm for arm in typing.get_args(tp) if arm is not type(None)]
        if len(arms) == 1:
            return arms[0]
    return tp


def _did_you_mean(key: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(tp: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             datetime.date: "a date (YYYY-MM-DD)", datetime.datetime: "a date-time (ISO 8601)"}
    if tp in names:
        return names[tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(tp) if arm is not type(None))
    return getattr(tp, "__name__", str(tp))


def _show(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


# ---------------------------------------------------------------------------------------------
# Writing, hashing and documenting a resolved config


def to_plain(config: Any) -> Any:
    """A JSON- and TOML-friendly view of a config: dataclasses become dicts, dates ISO strings."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, dict):
        return {str(key): to_plain(value) for key, value in config.items()}
    if isinstance(config, list | tuple):
        return [to_plain(value) for value in config]
    if isinstance(config, datetime.date):
        return config.isoformat()
    if isinstance(config, Path):
        return str(config)
    return config


def config_hash(config: Any) -> str:
    """The content hash of a resolved config: equal configs hash equal, whatever the key order."""
    canonical = json.dumps(to_plain(config), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def to_toml(config: Any, comments: bool = False) -> str:
    """Render a config dataclass as TOML; with `comments`, each field's docstring precedes it."""
    lines: list[str] = []
    _write_table(config, [], lines, comments)
    return "\n".join(lines).strip() + "\n"


def _write_table(config: Any, prefix: list[str], lines: list[str], comments: bool) -> None:
    docs = field_docs(type(config)) if comments else {}
    nested = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            nested.append((field.name, value))
            continue
        if comments and field.name in docs:
            lines.extend(_comment(docs[field.name]))
        if value is None:
            lines.append(f"# {_toml_key(field.name)} = (unset)")
        else:
            lines.append(f"{_toml_key(field.name)} = {_toml_value(to_plain(value))}")
    for name, value in nested:
        lines.append("")
        if comments and name in docs:
            lines.extend(_comment(docs[name]))
        lines.append(f"[{'.'.join(_toml_key(part) for part in [*prefix, name])}]")
        _write_table(value, [*prefix, name], lines, comments)


def _comment(doc: str) -> list[str]:
    return ["# " + line if line else "#" for line in textwrap.wrap(doc, 96)]


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value if item is not None) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + (f" {items} " if items else "") + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


@functools.cache
def field_docs(schema: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right after a field) of a dataclass, by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(schema)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for statement, following in zip(body, body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs
