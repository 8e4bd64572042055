"""autofl: hyperparameter search for personalized federated learning."""

__version__ = "0.1.0"
