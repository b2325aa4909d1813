"""The seam between the service and the model: what crosses it (protocol.py, pipe.py, spec.py),
the variants, the router over their backends, and the backends (backends/: by MODEL_BACKEND)."""
