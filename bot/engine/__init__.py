"""The seam between the service and the model: what crosses it, and the model-process client."""
