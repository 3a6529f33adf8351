"""The workspace: the project's `lumos.toml` and the folder (or URI) where every artifact lives.

Commands find `lumos.toml` by walking up from the working directory, or take `--workspace DIR`.
Without one, the embedded defaults apply relative to the working directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lumos.core.config import from_dict, read_toml, to_toml
from lumos.core.errors import UsageError
from lumos.core.settings import LumosSettings

CONFIG_FILE = "lumos.toml"


@dataclass(frozen=True)
class Workspace:
    settings: LumosSettings
    project_dir: Path
    """The folder holding lumos.toml (or the working directory when there is none)."""
    config_file: Path | None
    """The lumos.toml in force, if any."""

    @property
    def root(self) -> str:
        """Absolute local path or URI under which tables, runs and kernels are written."""
        root = self.settings.workspace.root
        if is_uri(root):
            return root.rstrip("/")
        return str((self.project_dir / root).resolve())

    @property
    def is_local(self) -> bool:
        return not is_uri(self.root) or self.root.startswith("file:")

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    @property
    def tables_root(self) -> str:
        return self.path("tables")

    @property
    def mlflow_tracking_uri(self) -> str:
        if self.settings.mlflow.tracking_uri:
            return self.settings.mlflow.tracking_uri
        return f"sqlite:///{self.path('mlflow.db')}"

    @property
    def mlflow_artifact_root(self) -> str:
        return self.settings.mlflow.artifact_root or self.path("mlartifacts")

    @property
    def kernels_dir(self) -> str:
        return self.path("kernels")

    def ensure_root(self) -> None:
        """Create the local workspace folder; remote roots are created by their writers."""
        if not is_uri(self.root):
            Path(self.root).mkdir(parents=True, exist_ok=True)


def is_uri(location: str) -> bool:
    return "://" in location or location.startswith("file:")


def find_config_file(start: Path) -> Path | None:
    """The nearest lumos.toml in `start` or any folder above it."""
    for folder in [start, *start.parents]:
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate
    return None


def open_workspace(workspace_dir: str | Path | None = None, overrides: Sequence[str] = ()) -> Workspace:
    """Load the workspace named by `--workspace`, else the nearest lumos.toml, else the defaults."""
    if workspace_dir is not None:
        project_dir = Path(workspace_dir).resolve()
        if project_dir.is_file() and project_dir.name == CONFIG_FILE:
            project_dir = project_dir.parent
        if not project_dir.is_dir():
            raise UsageError(f"--workspace {workspace_dir}: no such folder (create it with `lumos init {workspace_dir}`)")
        config_file = project_dir / CONFIG_FILE if (project_dir / CONFIG_FILE).is_file() else None
    else:
        config_file = find_config_file(Path.cwd().resolve())
        project_dir = config_file.parent if config_file else Path.cwd().resolve()
    data = read_toml(config_file) if config_file else {}
    source = str(config_file) if config_file else "embedded defaults"
    settings = from_dict(LumosSettings, data, source=source, overrides=overrides)
    return Workspace(settings=settings, project_dir=project_dir, config_file=config_file)


def init_workspace(directory: str | Path, force: bool = False) -> Path:
    """Write a commented lumos.toml holding the embedded defaults; refuse to overwrite one."""
    folder = Path(directory)
    target = folder / CONFIG_FILE
    if target.exists() and not force:
        raise UsageError(f"{target} already exists; edit it, or pass --force to replace it with the defaults")
    folder.mkdir(parents=True, exist_ok=True)
    header = (
        "# Lumos project settings. Every value below is the embedded default; delete what you do not\n"
        "# change. Commands find this file by walking up from the working directory.\n"
        "# Check the result with `lumos config show` and the machine with `lumos doctor`.\n\n"
    )
    target.write_text(header + to_toml(LumosSettings(), comments=True), encoding="utf-8")
    return target
