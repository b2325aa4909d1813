"""The variants report as JSON (`admin variants --json`, the dashboard): NaN (no data) as
None, timestamps as ISO 8601 strings.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from datetime import UTC
from typing import Any

from bot.reports.variant_stats import SRM_ALPHA
from bot.reports.variants import VariantReport


def json_ready(value: Any) -> Any:
    """`value` with every NaN or infinite float (no data) as None, for JSON; dicts, lists and
    tuples (as lists) all the way down."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def report_json(report: VariantReport) -> dict[str, Any]:
    """The report as JSON-ready data; NaN (no data) becomes None."""
    data = {
        "experiment": report.experiment,
        "control": report.control,
        "variants": [{**asdict(f), "votes": f.votes} for f in report.variants],
        "comparisons": [asdict(c) for c in report.comparisons],
        "srm": {**asdict(report.srm), "alpha": SRM_ALPHA},
        "arena": [asdict(r) for r in report.arena],
        "allocation": report.allocation,
        "recorded_probabilities": report.recorded,
        "bandit": report.bandit,
        "note": report.note,
        "autopilot": report.autopilot,
        "decisions": [
            {**asdict(d), "created_at": d.created_at.astimezone(UTC).isoformat()}
            for d in report.decisions
        ],
    }
    result: dict[str, Any] = json_ready(data)
    return result
