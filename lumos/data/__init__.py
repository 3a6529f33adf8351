"""Data: recipes, sources, validation, vocab + sequences (Spark), Delta-log reader and the training loader."""
