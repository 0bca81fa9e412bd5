"""The served model as MLflow's models-from-code logs it: this file goes into the registry instead of a pickled
object, so a version carries code a reader can read, and the project's own clients load its ONNX file as data."""

import mlflow.models

from thermal2visible.inference.serving import ThermalToVisible

mlflow.models.set_model(ThermalToVisible())
