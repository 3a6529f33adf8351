"""Training: the features contract, the model, the loop (one code path for 1..N ranks), launch and MLflow."""
