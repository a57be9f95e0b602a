"""Settings of one node: the demo project's own, read from the environment each process
is given (DATABASE_URL through the pooler, DATABASE_POOL_MODE=transaction, Redis for
the broker and the cache), as a machine of its own would read them.

One difference: a deferred event (202, captured as a failed event when the database
went away mid-claim) is retried within seconds rather than after up to a minute, so
that a run waits for it in seconds.
"""

from project.settings import *  # noqa: F403
from project.settings import WEBHOOK_RECEIVER as _PROJECT_WEBHOOK_RECEIVER

WEBHOOK_RECEIVER = {
    **_PROJECT_WEBHOOK_RECEIVER,
    # its merchants listen on loopback
    "EGRESS_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
    "RETRY_BASE_DELAY_SECONDS": 1,
    "RETRY_MAX_DELAY_SECONDS": 4,
}
