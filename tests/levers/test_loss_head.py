"""levers/loss_head.py on CPU: `route_forward` makes a plain HF model's own forward run the loss
head when given ds_longctx's shift labels (what the HF Trainer integration hands DeepSpeed), leaves
it unchanged otherwise, and `unroute_forward` restores it exactly (no child, no instance forward).
Reference: the loss head called directly."""

import torch

from ds_longctx.levers.loss_head import ROUTE_KWARG, LossHead, route_forward, unroute_forward
from ds_longctx.parallel.parallel_state import ParallelState
from ds_longctx.parallel.sharding import shift_labels
from tests.helpers import rel_err, tiny_model


def test_route_forward_runs_the_loss_head_and_unroute_restores_the_model():
    model = tiny_model(seed=0)
    ids = torch.randint(4, 500, (1, 24))
    pos = torch.arange(24)[None]
    labels = shift_labels(ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    keys = set(model.state_dict())
    head = LossHead(model, ParallelState.single(), chunked=True, chunk_rows=8)
    want = head(ids, pos, labels)

    route_forward(model, head)
    got = model(input_ids=ids, position_ids=pos, **{ROUTE_KWARG: labels})
    assert all(rel_err(g, w) == 0 for g, w in zip(got, want))
    assert set(model.state_dict()) == keys  # the loss child has no parameters of its own
    with torch.no_grad():
        assert torch.equal(
            model(input_ids=ids).logits, logits
        )  # without the keyword: the model's own forward

    unroute_forward(model)
    assert "forward" not in model.__dict__ and not hasattr(model, "ds_longctx_loss")
    assert model.forward.__func__ is type(model).forward
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, logits)


def test_unroute_restores_an_instance_forward_set_before():
    """TRL's SFTTrainer sets its own forward on the instance first; routing goes over it and
    back."""
    model = tiny_model(seed=0)
    own = model.forward
    model.forward = own  # an instance attribute, as TRL's add_fused_lm_head leaves it
    route_forward(model, LossHead(model, ParallelState.single()))
    assert model.forward is not own
    unroute_forward(model)
    assert model.__dict__["forward"] is own
