"""The demo's log lines: one format for every process, so that the logs of gunicorn's
master and workers, Celery's worker and beat read as one timeline.

A line is its time, level, logger and process, then the message (one line each):

    2026-11-30 11:55:43,701 WARNING webhook_receiver.inbound.failures [4242] webhook …
    2026-11-30 11:55:43,702 INFO gunicorn.access [4242] 127.0.0.1 "POST /webhooks/shop/ …

Used by project/settings.py (Django's LOGGING, Celery's worker formats) and
deploy/gunicorn.conf.py (gunicorn's own error and access lines). Importing it has no
side effects, so gunicorn's master can read it before any worker loads the app.
"""

LINE = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
# Celery's task lines: the same, with the task's name and id before the message
TASK_LINE = LINE.replace("%(message)s", "%(task_name)s[%(task_id)s] %(message)s")

# Libraries that log a line per routine call, off below these levels: httpx and
# httpcore log every outbound request at INFO (reconciliation's, without the event's
# key: the app logs what matters of them itself); django-health-check logs each failing
# check of every probe with its traceback (the health view logs one line a failing
# probe instead); stripe logs its requests when asked to.
QUIET_LIBRARIES = {
    "httpx": "WARNING",
    "httpcore": "WARNING",
    "stripe": "WARNING",
    "health_check": "ERROR",
}
