"""The MLflow model registry as Lumos uses it: names, versions, aliases and lineage tags.

A model is named on the command line as `NAME@alias` (what cron jobs use: the alias moves, the
command stays) or `NAME/VERSION` (an exact version). Every version points at a Lumos training run;
its tags carry that run's lineage so the registry alone answers "what made this model".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lumos.core.errors import UsageError
from lumos.core.tracking import tracking_client
from lumos.core.workspace import Workspace

DEFAULT_ALIAS = "production"
"""The alias `lumos promote` moves unless told otherwise, and nightly jobs name (NAME@production)."""

_NAME = r"[A-Za-z][A-Za-z0-9_.-]*"
MODEL_NAME = re.compile(rf"^{_NAME}$")
MODEL_REF = re.compile(rf"^(?P<name>{_NAME})(?:@(?P<alias>[A-Za-z][A-Za-z0-9_-]*)|/(?P<version>\d+))$")


@dataclass(frozen=True)
class ModelVersionInfo:
    name: str
    version: int
    run_id: str
    aliases: tuple[str, ...]
    tags: dict[str, str] = field(default_factory=dict)
    created_at: int = 0
    """Milliseconds since the epoch, as MLflow stores it."""

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"


def check_model_name(name: str, flag: str = "--model") -> str:
    if not MODEL_NAME.match(name):
        raise UsageError(f"{flag} {name!r}: a model name starts with a letter and holds letters, digits, _ . -")
    return name


def resolve_model(workspace: Workspace, text: str, flag: str = "--model") -> ModelVersionInfo:
    """The version behind `NAME@alias` or `NAME/VERSION`."""
    import mlflow

    match = MODEL_REF.match(text.strip())
    if not match:
        raise UsageError(f"{flag} {text!r}: expected NAME@alias or NAME/VERSION, e.g. quickstart@production")
    client = tracking_client(workspace)
    name = match["name"]
    try:
        if match["alias"]:
            version = client.get_model_version_by_alias(name, match["alias"])
        else:
            version = client.get_model_version(name, match["version"])
    except mlflow.exceptions.MlflowException:
        raise UsageError(f"{flag} {text}: no such registered model version; `lumos models` lists them") from None
    return _info(version)


def model_versions(workspace: Workspace, name: str) -> list[ModelVersionInfo]:
    """Every version of registered model `name`, newest first (empty when the name is unknown)."""
    client = tracking_client(workspace)
    check_model_name(name, "NAME")
    versions = client.search_model_versions(f"name = '{name}'")
    # search_model_versions omits aliases on some stores; get_model_version always has them.
    return sorted((_info(client.get_model_version(name, v.version)) for v in versions), key=lambda v: -v.version)


def registered_names(workspace: Workspace) -> list[str]:
    return sorted(model.name for model in tracking_client(workspace).search_registered_models())


def version_for_run(workspace: Workspace, name: str, run_id: str) -> ModelVersionInfo | None:
    """The version of `name` already made from `run_id`, if any (so promoting twice reuses it)."""
    matches = [version for version in model_versions(workspace, name) if version.run_id == run_id]
    return matches[-1] if matches else None


def register_version(workspace: Workspace, name: str, run_id: str, source: str, tags: dict[str, str],
                     description: str | None = None) -> ModelVersionInfo:
    """A new version of `name` from `source`: a logged model (models:/<model id>, whose signature
    the registry shows) or an artifact folder of the run."""
    import mlflow

    client = tracking_client(workspace)
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name, description="Lumos model; versions are training runs, see their lumos.* tags")
    model_id = source.removeprefix("models:/") if source.startswith("models:/") else None
    version = client.create_model_version(name, source=source, run_id=run_id, tags=tags, description=description,
                                          model_id=model_id)
    return _info(client.get_model_version(name, version.version))


def set_alias(workspace: Workspace, name: str, alias: str, version: int) -> None:
    tracking_client(workspace).set_registered_model_alias(name, alias, str(version))


def _info(version) -> ModelVersionInfo:
    return ModelVersionInfo(
        name=version.name,
        version=int(version.version),
        run_id=version.run_id,
        aliases=tuple(sorted(version.aliases or ())),
        tags=dict(version.tags or {}),
        created_at=int(version.creation_timestamp or 0),
    )
