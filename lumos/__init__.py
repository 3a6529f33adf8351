"""Lumos: foundation models of user behaviour, from raw event logs to daily predictions."""

__version__ = "0.1.0"
