"""The demo's log lines: one format for every process, so that the logs of gunicorn's
master and workers, Celery's worker and beat read as one timeline.

A line is its time, level, logger and process, then the message (one line each):

    2026-11-30 11:55:43,701 WARNING webhook_receiver.inbound.failures [4242] webhook …
    2026-11-30 11:55:43,702 INFO gunicorn.access [4242] 127.0.0.1 "POST /webhooks/shop/ …

Used by project/settings.py (Django's LOGGING, Celery's worker formats) and
deploy/gunicorn.conf.py (gunicorn's own error and access lines). Importing it has no
side effects, so gunicorn's master can read it before any worker loads the app.
"""

import logging
import time
from typing import Any

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


class BrokerOutageLines(logging.Filter):
    """Celery's own lines through a broker outage, as one line when it starts and one
    when the broker answers again, per process (the app's outages log so too: outages.Outage).

    Without it, beat logs every scheduled task it cannot send, an ERROR with the call
    stack and a chained traceback (10,931 lines in a 180 s Redis outage), and the worker's
    consumer each reconnection attempt. Attached (settings.LOGGING) to the loggers that
    write those lines:

    - ``celery.beat``: the first "Message Error: Couldn't apply scheduled task" caused
      by the broker becomes "broker not answering: <error>; …" without its traceback;
      the next are dropped (counted) until a task is published again (Celery's
      ``after_task_publish`` signal), which logs "broker answers again after N s".
    - ``celery.worker.consumer.consumer``: "Connection to broker lost" (one line) starts
      the outage, or the first "Cannot connect to" at startup (cut to its first line);
      the next attempts are dropped, and so is the routine "Skipping prefetch count
      reduction" note. ``celery.worker.consumer.connection``'s "Connected to" ends it,
      with the outage's length.

    Any other error, a task that fails to be sent for another reason included, passes
    whole. Per process, without a lock: a race only doubles a line.
    """

    def __init__(self) -> None:
        super().__init__()
        self.since: float | None = None
        self.logger_name = ""
        self.dropped = 0
        from celery.signals import after_task_publish

        after_task_publish.connect(self._published, weak=False)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == "celery.beat":
            if message.startswith("Message Error") and _broker_error(record.exc_info):
                return self._failed(record, "scheduled tasks are not sent until it answers")
        elif record.name == "celery.worker.consumer.consumer":
            if message.startswith("consumer: Connection to broker lost"):
                self._start(record)
                return True
            if message.startswith("consumer: Cannot connect to"):
                return self._failed(record, "the worker takes no task until it answers")
            if message.startswith("Skipping prefetch count reduction"):
                return False
        elif record.name == "celery.worker.consumer.connection" and self.since is not None:
            record.msg, record.args = f"{message}: {self._back()}", ()  # "Connected to …"
        return True

    def _start(self, record: logging.LogRecord) -> None:
        if self.since is None:
            self.since, self.dropped, self.logger_name = time.monotonic(), 0, record.name

    def _failed(self, record: logging.LogRecord, meanwhile: str) -> bool:
        if self.since is not None:
            self.dropped += 1
            return False
        self._start(record)
        exc = _root_cause(record.exc_info[1]) if record.exc_info else None
        error = (
            f"{type(exc).__module__}.{type(exc).__qualname__}: {_first_line(str(exc))}"
            if exc is not None
            else _first_line(record.getMessage())
        )
        record.msg, record.args = f"broker not answering: {error}; {meanwhile}", ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True

    def _back(self) -> str:
        since, self.since = self.since or time.monotonic(), None
        return (
            f"broker answers again after {time.monotonic() - since:.1f} s "
            f"({self.dropped} more failures not logged)"
        )

    def _published(self, **kwargs: object) -> None:
        # beat's first task sent after the outage; the worker's "Connected to" says it there
        if self.since is not None and self.logger_name == "celery.beat":
            logger = logging.getLogger(self.logger_name)
            # handle(): past the logger's level (WARNING for beat), as the outage's line was
            logger.handle(logger.makeRecord(
                logger.name, logging.INFO, __file__, 0, self._back(), (), None
            ))  # fmt: skip


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _causes(exc: BaseException | None) -> list[BaseException]:
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _root_cause(exc: BaseException | None) -> BaseException | None:
    chain = _causes(exc)
    # the broker's own error (kombu's), not Celery's SchedulingError around it
    return next((e for e in chain if _is_broker_error(e)), chain[0] if chain else None)


def _broker_error(exc_info: Any) -> bool:
    return bool(exc_info) and any(_is_broker_error(e) for e in _causes(exc_info[1]))


def _is_broker_error(exc: BaseException) -> bool:
    from kombu.exceptions import OperationalError

    return isinstance(exc, OperationalError | OSError)
