"""ParlAI's TrainLoop, reporting to our progress bar and keeping the last weights."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from parlai.scripts.train_model import TrainLoop, load_eval_worlds

from bot.training.progress import Progress

log = logging.getLogger(__name__)


def metric_value(report: Mapping[str, Any], key: str) -> float | None:
    """A report's metric as a float (None when absent or not a number)."""
    metric = report.get(key)
    if metric is None:
        return None
    value = metric.value() if hasattr(metric, "value") else metric
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class BudgetTrainLoop(TrainLoop):  # type: ignore[misc]
    """TrainLoop that reports to our progress bar and always keeps the last weights."""

    progress: Progress | None = None
    tps_samples: list[float]

    def __init__(self, opt: Any) -> None:
        super().__init__(opt)
        self.tps_samples = []

    def log(self) -> Any:
        report = super().log()
        tps = metric_value(report, "tps")
        if tps:
            # tokens (context + label) per second over this log interval
            self.tps_samples.append(tps)
        bits = [
            f"{name}={value:.3g}"
            for name, value in (
                ("loss", metric_value(report, "loss")),
                ("ppl", metric_value(report, "ppl")),
                ("tok/s", tps),
                ("steps", float(self._train_steps)),
            )
            if value is not None
        ]
        if self.progress is not None:
            self.progress.postfix = " ".join(bits)
        return report

    def validate(self) -> Any:
        stop = super().validate()
        if self.progress is not None and self.valid_reports:
            last = self.valid_reports[-1]
            self.progress.write(
                f"validation after {last.get('train_time', 0):.0f}s: "
                f"ppl {last.get('ppl', float('nan')):.2f}, "
                f"loss {last.get('loss', float('nan')):.3f}"
            )
        # A minutes-long run is far from converged: later weights beat earlier ones even
        # when one validation is noisy, so make TrainLoop save the final weights instead
        # of reloading the best validated ones at the end.
        self.saved = False
        return stop

    def train_final(self) -> dict[str, Any]:
        """Train, then one evaluation of the final weights on the held-out slice."""
        for _ in self.train_steps():
            pass
        if self.progress is not None:
            self.progress.close()
        log.info("evaluating the final weights on the held-out conversations")
        worlds = load_eval_worlds(self.agent, self.opt, "valid")
        report = self._run_eval(worlds, self.opt, "valid", self.opt["validation_max_exs"])
        for world in worlds:
            world.shutdown()
        self.final_valid_report = report
        self._save_train_stats()
        return dict(report)
