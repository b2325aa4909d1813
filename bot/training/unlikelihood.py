"""Token-level unlikelihood on disliked replies, likelihood on liked ones: the training agent of
`train --from-feedback --negatives unlikelihood` (bot.training.feedback).

A training example with a negative `reward` (ParlAI's own field, which batchify hands the agent
as `batch.rewards`; bot.training.feedback_data writes `reward:-1` for a reply with more 👎 than 👍)
is a negative. For its
reply tokens y_1..y_T, read with teacher forcing after the context the model read, the loss is
Welleck et al.'s unlikelihood term (2020, "Neural text generation with unlikelihood training",
eq. 4, with the reply's own tokens as the negative candidates)

    - sum_t log(1 - p(y_t | context, y_<t))

which is zero when the model gives the disliked reply no probability and grows without bound as
it approaches 1, so it pushes the model away from the reply without rewarding any one other
token. Every other example is a positive and keeps ParlAI's maximum-likelihood loss
(- sum_t log p(y_t | ...)). The batch loss is (sum of positive NLL + alpha * sum of negative
unlikelihood) / all label tokens, alpha = `--unlikelihood-alpha`.

ParlAI 1.7.2's package ships no `projects/` (the dialogue_unlikelihood agents are in its
repository only), so this is a subclass of the stock transformer/generator agent that replaces
`compute_loss`; the model, its weights and the saved options are the stock agent's, and
bot.training.feedback writes the base's own `model` back into the candidate's options, so the
service loads it like any other transformer/generator.

Why unlikelihood and not the Cringe loss (Adolphs et al. 2022): Cringe contrasts each negative
token with a token sampled from the model's own top-k at that position, which needs the
model's predictions for every disliked reply and a sampling step inside the loss; unlikelihood
needs neither, has one knob (alpha), and its effect is read directly off the perplexity of
held-out disliked replies, which recipe.json already records.

Validation data are liked replies only, so `ppl` and `loss` on validation are the ordinary
ones; during training they are recorded over the positive tokens only, and `ul_loss` (mean
unlikelihood per negative token) beside them.
"""

from __future__ import annotations

from typing import Any

import torch
from parlai.agents.transformer.transformer import TransformerGeneratorAgent
from parlai.core.metrics import AverageMetric
from parlai.core.torch_generator_agent import PPLMetric

NEGATIVE_REWARD = -1  # the `reward` of a disliked reply's example
MIN_ONE_MINUS_P = 1e-5  # clamp inside the log: a certain token costs -log(1e-5), not inf


class UnlikelihoodAgent(TransformerGeneratorAgent):  # type: ignore[misc]
    """transformer/generator whose training loss is likelihood on positives and token-level
    unlikelihood on negatives (see the module docstring)."""

    @classmethod
    def add_cmdline_args(cls, parser: Any, partial_opt: Any = None) -> Any:
        super().add_cmdline_args(parser, partial_opt=partial_opt)
        group = parser.add_argument_group("Unlikelihood on disliked replies")
        group.add_argument(
            "--unlikelihood-alpha",
            type=float,
            default=1.0,
            help="weight of the unlikelihood term of disliked replies",
        )
        return parser

    def compute_loss(self, batch: Any, return_output: bool = False) -> Any:
        if batch.label_vec is None:
            raise ValueError("Cannot compute loss without a label.")
        model_output = self.model(*self._model_input(batch), ys=batch.label_vec)
        scores, preds, *_ = model_output
        labels = batch.label_vec
        notnull = labels.ne(self.NULL_IDX)
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        target = logprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # log p(y_t)
        if batch.rewards is not None:  # only where some example has a reward
            negative = (batch.rewards < 0).to(labels.device).unsqueeze(1)
        else:
            negative = torch.zeros_like(labels[:, :1], dtype=torch.bool)
        pos_mask = notnull & ~negative
        neg_mask = notnull & negative
        nll = -target
        one_minus_p = (1.0 - target.exp()).clamp(min=MIN_ONE_MINUS_P)
        ul = -torch.log(one_minus_p)

        if pos_mask.any():
            self.record_local_metric("loss", AverageMetric.from_mask(nll.detach(), pos_mask))
            self.record_local_metric("ppl", PPLMetric.from_mask(nll.detach(), pos_mask))
            self.record_local_metric(
                "token_acc", AverageMetric.from_mask(labels == preds, pos_mask)
            )
        if neg_mask.any():
            self.record_local_metric("ul_loss", AverageMetric.from_mask(ul.detach(), neg_mask))

        alpha = float(self.opt.get("unlikelihood_alpha", 1.0))
        total = (nll * pos_mask).sum() + alpha * (ul * neg_mask).sum()
        loss = total / notnull.sum().clamp(min=1)
        if return_output:
            return (loss, model_output)
        return loss
