"""The loss under the HF Trainer, one optimizer step's rows weighed as `ds-longctx train` weighs
them.

    batches, _ = trainer.get_batch_samples(epoch_iterator, k, device)  # row weights made here
    loss = trainer.compute_loss(model, batches[i])                     # sum_r w_r x CE sum of row r

Weights and which tokens train: docs/design/integrations.md."""

from __future__ import annotations

# torch is imported where a loss is computed: hf_trainer imports this module, and importing
# hf_trainer must not.
from collections import deque

from ds_longctx.parallel.units import IGNORE_INDEX


def check_padding(attention_mask) -> None:
    """Right padding only, so the attention mask can be dropped."""
    if attention_mask is None or bool(attention_mask.all()):
        return
    if bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
        raise ValueError(
            "a batch with left padding (attention_mask 0 before 1): ds_longctx drops the mask, "
            "which is "
            "exact only for right padding; pad on the right (tokenizer.padding_side = 'right')"
        )


def batch_labels(inputs: dict):
    """`[b, L]` labels of a collated batch, IGNORE_INDEX where attention_mask is 0."""
    import torch

    labels = inputs.get("labels")
    labels = inputs["input_ids"] if labels is None else labels
    mask = inputs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        labels = torch.where(mask.to(torch.bool), labels, torch.full_like(labels, IGNORE_INDEX))
    return labels


def step_row_weights(batches: list, state, average: str, device) -> list:
    """Per batch of one optimizer step, its row weights (`run/batch_loss.step_weights`), reduced on
    `device`."""
    from ds_longctx.data.rows import Batch
    from ds_longctx.run.batch_loss import step_weights

    rows = [
        Batch(
            input_ids=b["input_ids"].to(device),
            labels=batch_labels(b).to(device),
            position_ids=None if b.get("position_ids") is None else b["position_ids"].to(device),
        )
        for b in batches
    ]
    return step_weights(rows, state, average)[0]


class LongCtxLossMixin:
    """The Trainer's step, loss and eval loss under ds_longctx; needs `longctx_state`,
    `longctx_config` and `longctx` on the trainer."""

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The Trainer's prefetch of one step's batches, with their row weights."""
        batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._longctx_weights = deque(
            step_row_weights(
                batches,
                self.longctx_state,
                self.longctx_config.train.loss_average,
                self.args.device,
            )
        )
        self._longctx_micro = max(
            len(batches), 1
        )  # a mixture of experts' aux: the mean over the step's batches
        return batches, count

    def _longctx_forward(self, model, inputs, row_weights=None, micro_batches: int = 1):
        """The loss head's triple on this rank's slice of `inputs`."""
        from ds_longctx.levers.loss_head import ROUTE_KWARG, WEIGHTS_KWARG
        from ds_longctx.run.batch_loss import sharded_loss

        check_padding(inputs.get("attention_mask"))

        def run(input_ids, position_ids, shift_labels, row_weights=None):
            return model(
                input_ids=input_ids,
                position_ids=position_ids,
                **{ROUTE_KWARG: shift_labels, WEIGHTS_KWARG: row_weights},
            )

        return sharded_loss(
            run,
            self.longctx,
            self.longctx_state,
            self.args.device,
            inputs["input_ids"],
            inputs.get("position_ids"),
            batch_labels(inputs),
            row_weights=row_weights,
            micro_batches=micro_batches,
        )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Sum over the rows of weight x CE sum on this rank's slice; with `return_outputs`, also
        {"tokens": trained tokens}."""
        if not getattr(self, "_longctx_weights", None):
            self._longctx_weights = deque(
                step_row_weights(
                    [inputs],
                    self.longctx_state,
                    self.longctx_config.train.loss_average,
                    self.args.device,
                )
            )
            self._longctx_micro = 1
        loss, _, n = self._longctx_forward(
            model, inputs, self._longctx_weights.popleft(), self._longctx_micro
        )
        return (loss, {"tokens": n}) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        """Forward and backward of one batch; DeepSpeed steps at the step's last batch. Returns this
        rank's share of the step's loss."""
        if not getattr(
            self, "_longctx_optimizer_state", False
        ):  # optimizer.state_at_build, before the first batch
            from ds_longctx.run.optimizer_state import at_start

            at_start(
                self.longctx_config, getattr(model, "optimizer", None), self.longctx_state.rank
            )
            self._longctx_optimizer_state = True
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        self.accelerator.backward(
            loss, scale_wrt_gas=False
        )  # the weights already cover the step's batches
        return loss.detach()

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """(the SP group's token-mean loss, None, None): eval without logits."""
        import torch

        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            _, group_loss, _ = self._longctx_forward(model, inputs)
        return group_loss.detach(), None, None
