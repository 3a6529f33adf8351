"""The `lumos` command line: one module per verb, each thin over one core function."""
