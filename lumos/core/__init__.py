"""Shared core: config, workspace, lineage, errors, the Spark session and versioned tables."""
