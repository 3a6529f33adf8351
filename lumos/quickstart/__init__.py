"""The quickstart: embedded recipes (ingest.toml, train.toml, tasks/) over synthetic data, and
`run_quickstart`, which takes an empty folder through every verb."""

from pathlib import Path

RECIPES = Path(__file__).resolve().parent
"""The folder of the embedded quickstart recipes: ingest.toml, train.toml and tasks/*.toml."""
