"""gunicorn settings for a deployment of the demo project behind nginx (deploy/nginx.conf).

    gunicorn project.wsgi -c deploy/gunicorn.conf.py

Sync workers are right here, because nginx hands them only complete requests: a
worker is busy for the app's time, never for a sender's. Without nginx in front, a
slow sender holds a sync worker as long as it likes (`make run` is for development).
"""

import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

from gunicorn.glogging import Logger

from project import logs

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# The usual rule of thumb: two per core, plus one.
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count() * 2 + 1))
worker_class = "sync"
# A worker stuck this long is replaced. The app bounds its own database time (the
# claim's lock and statement timeouts), so this is a last resort, not a habit.
timeout = 30
graceful_timeout = 30
# Workers are replaced after a while, so that no slow leak grows for ever.
max_requests = 10000
max_requests_jitter = 1000
accesslog = "-"


class TimelineLogger(Logger):
    """gunicorn's lines in the app's format (project/logs.py): its own (a worker booted,
    or timed out) and the access log's, so that they interleave with the app's as one
    timeline. Only the format changes: --log-level, --access-logfile and --error-logfile
    work as ever."""

    error_fmt = logs.LINE
    datefmt = None  # logging's own, as the app's lines have it
    access_fmt = logs.LINE


logger_class = TimelineLogger
# the request, its answer and how long it took (the line's own time comes first)
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms "%(a)s"'

# --- metrics (webhook_receiver/watch/metrics/, docs/watching.md) ------------------------
# The workers are separate processes, so prometheus_client runs in multiprocess mode:
# each worker writes its counters to files in this directory, and a scrape, whichever
# worker answers it, sums them all. prometheus_client picks its mode when it is first
# imported, so the variable is set here, in the master, before any worker imports the
# app. Unset, the server makes a directory of its own and removes it when it stops.
METRICS_DIR_PREFIX = "webhook-receiver-metrics-"
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix=METRICS_DIR_PREFIX)


def on_starting(server):
    # Counters start at zero with the server: a previous run's files would be summed
    # again, and a new worker whose pid a dead one had would carry on from its values.
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.db"):
        path.unlink()


def child_exit(server, worker):
    # A dead worker's counters stay (they are part of the totals); its live gauges go.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    # only a directory made above: one an operator chose stays (emptied at next start)
    if directory.parent == Path(tempfile.gettempdir()) and directory.name.startswith(
        METRICS_DIR_PREFIX
    ):
        shutil.rmtree(directory, ignore_errors=True)
