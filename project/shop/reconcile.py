"""The shop's side of reconciliation: its order states against what a sender lists.

Named in WEBHOOK_RECEIVER["STATE_COMPARISON"]. Reconciliation owns no business state: it
asks the shop which order state each listed event sets (``order.paid`` at version 3),
and, for a batch of orders, how ours differ from the sender's latest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from webhook_receiver.reconcile import SenderEvent, StateComparison, StateMismatch, SubjectState

from .models import OrderState


class OrderStates(StateComparison):
    def state_of(self, event: SenderEvent) -> SubjectState | None:
        """``order.<status>`` with a string ``order_id`` and an integer ``version``."""
        if not event.type.startswith("order."):
            return None
        order_id, version = event.data.get("order_id"), event.data.get("version")
        if (
            not isinstance(order_id, str)
            or not isinstance(version, int)
            or isinstance(version, bool)
        ):
            return None
        return SubjectState(
            subject=order_id, state=event.type.removeprefix("order."), version=version
        )

    def compare(
        self, *, source: str, states: Mapping[str, SubjectState]
    ) -> Iterator[StateMismatch]:
        """An order whose status or version here differs from the sender's latest (ours
        behind, or ahead), or that we do not hold at all. One query per batch."""
        ours = {
            state.order_id: state
            for state in OrderState.objects.filter(order_id__in=list(states)).only(
                "order_id", "status", "version"
            )
        }
        for order_id, sender in states.items():
            state = ours.get(order_id)
            if state is not None and (state.status, state.version) == (
                sender.state,
                sender.version,
            ):
                continue
            yield StateMismatch(
                subject=order_id,
                sender_says={"status": sender.state, "version": sender.version},
                we_hold={} if state is None else {"status": state.status, "version": state.version},
            )
