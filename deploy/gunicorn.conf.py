"""gunicorn settings for a deployment of the demo project behind nginx (deploy/nginx.conf).

    gunicorn project.wsgi -c deploy/gunicorn.conf.py

Sync workers are right here, because nginx hands them only complete requests: a
worker is busy for the app's time, never for a sender's. Without nginx in front, a
slow sender holds a sync worker as long as it likes (`make run` is for development).
"""

import multiprocessing
import os

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
