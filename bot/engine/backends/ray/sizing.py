"""MODEL_BACKEND=ray's keys in a variant's table (VARIANTS_FILE, `admin variants add`): its
deployment's replicas, and the CPUs and GPUs of each (bot.engine.backends.ray.cluster sizes
the deployment with them). Validated wherever a variant is, whatever MODEL_BACKEND is now: the
same file may be served on Ray later."""

from __future__ import annotations

import math
from typing import Any

# key -> (lowest, highest); `replicas` a whole number, the resources per replica numbers (Ray's
# fractions).
KEYS: dict[str, tuple[float, float]] = {
    "replicas": (1, 64),
    "num_cpus": (0, 256),
    "num_gpus": (0, 64),
}


def parse(table: dict[str, Any], label: str, problems: list[str]) -> dict[str, Any]:
    """The variant's sizing (its Variant fields, defaults filled in); a problem for each bad
    key, named by `label`, appended to `problems`."""
    ray: dict[str, float] = {}
    for key, (bottom, top) in KEYS.items():
        if key not in table:
            continue
        amount = table[key]
        whole = key == "replicas"
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int if whole else int | float)
            or not math.isfinite(amount)
            or not bottom <= amount <= top
        ):
            kind = "a whole number" if whole else "a number"
            problems.append(f"{label}: {key} must be {kind} from {bottom:g} to {top:g}")
        else:
            ray[key] = float(amount)
    if ray.get("num_cpus") == 0 and ray.get("num_gpus", 0) == 0:
        problems.append(f"{label}: num_cpus = 0 needs num_gpus above 0 (a replica needs a core)")
    return {
        "replicas": int(ray.get("replicas", 1)),
        "num_cpus": float(ray.get("num_cpus", 1.0)),
        "num_gpus": float(ray.get("num_gpus", 0.0)),
    }
