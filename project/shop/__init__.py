"""The demo commerce domain: the host project's inventory ledger and order state.

It shows a host how to use ``webhook_receiver``: handlers registered for its event
types run inside the claim's transaction, so a receipt exists if and only if the ledger
or order-state change it caused committed.
"""
