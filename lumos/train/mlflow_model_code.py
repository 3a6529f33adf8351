"""The model-from-code file MLflow stores with a Lumos model; loading the model runs it."""

import mlflow.models

from lumos.train.mlflow_model import LumosPyfunc

mlflow.models.set_model(LumosPyfunc())
