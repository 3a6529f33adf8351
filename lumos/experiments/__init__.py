"""Experiments over many runs: reproduce one run from its lineage, sweep a recipe over a grid and seeds.

They orchestrate ingest, train and eval through the same core functions the verbs call, so they
sit above eval in the layers (core < data < train < eval < infer < experiments < quickstart < cli).
"""
