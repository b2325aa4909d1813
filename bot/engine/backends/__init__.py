"""The backends a variant's model runs on, one module (or package) each: local.py (a worker
process on this machine, or this process), ray/ (Ray Serve); registry.py maps MODEL_BACKEND to
each one's factory and its keys in a variant's table."""
