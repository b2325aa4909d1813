"""MODEL_BACKEND=ray: each variant a Ray Serve application (backend.py: the router's Backend over
its handle; cluster.py: this process's connection, the applications front-ends share, the
deployment; sizing.py: a variant's replicas, CPUs and GPUs)."""
