"""The served settings of a chaos run: the demo project's, with the retry schedule of
failed events shortened so that a run drains in seconds rather than hours.

The demo keeps the app's defaults (a first retry within 60 s, eight attempts): right for a
deployment, but a run that locks the receipts table for 25 s defers hundreds of events
and must see every one of them applied before it checks. Everything else is the demo's
(``project/settings.py``), read from the environment the run gives each process, but for
a defect planted on purpose (``--plant``, below).
"""

import os

from project.settings import *  # noqa: F403

WEBHOOK_RECEIVER = {
    **WEBHOOK_RECEIVER,  # noqa: F405
    # its merchants listen on loopback
    "EGRESS_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
    # retry n waits a random time in [0, min(5, 1 * 2**(n-1))] s; 40 attempts outlast
    # any fault of the run (the longest holds a table for 25 s)
    "RETRY_BASE_DELAY_SECONDS": 1,
    "RETRY_MAX_DELAY_SECONDS": 5,
    "RETRY_MAX_ATTEMPTS": 40,
}

# python -m tests.chaos --plant NAME: a defect planted in every process, for a run that
# must fail (plants.py); never set otherwise
if os.environ.get("CHAOS_PLANT"):
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos.plants.PlantedDefect"]  # noqa: F405
