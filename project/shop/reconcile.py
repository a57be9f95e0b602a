"""The shop's side of reconciliation: its order states against what a sender lists.

Named in WEBHOOK_RECEIVER["STATE_COMPARISON"]. Reconciliation owns no business state;
it asks the host, for a batch of orders, how ours differ from the sender's latest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from webhook_receiver.reconcile.run import SenderOrder, StateMismatch

from .models import OrderState


def compare_order_states(
    *, source: str, orders: Mapping[str, SenderOrder]
) -> Iterator[StateMismatch]:
    """An order whose status or version here differs from the sender's latest (ours
    behind, or ahead), or that we do not hold at all. One query per batch."""
    ours = {
        state.order_id: state
        for state in OrderState.objects.filter(order_id__in=list(orders)).only(
            "order_id", "status", "version"
        )
    }
    for order_id, sender in orders.items():
        state = ours.get(order_id)
        if state is not None and (state.status, state.version) == (sender.status, sender.version):
            continue
        yield StateMismatch(
            order_id=order_id,
            sender_says={"status": sender.status, "version": sender.version},
            we_hold={} if state is None else {"status": state.status, "version": state.version},
        )
