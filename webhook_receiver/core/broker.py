"""What a host whose Celery broker is Redis names in its settings, for a broker that
restarts or stops answering:

- ``Transport``, kombu's Redis transport with a channel that finishes closing when Redis
  has gone away: ``CELERY_BROKER_TRANSPORT = "webhook_receiver.core.broker:Transport"``
  (Celery's ``broker_transport``; the broker URL stays ``redis://…``);
- ``BrokerOutageLines``, a logging filter that makes Celery's own lines through an
  outage two lines: ``"filters": {"broker_outage": {"()":
  "webhook_receiver.core.broker.BrokerOutageLines"}}`` in ``LOGGING``, on the loggers
  its docstring names.

Why: with Celery 5.7 a Redis restart ends a worker that holds an unacknowledged message
(a task running under ``acks_late``, or one prefetched): ``Unrecoverable error:
AttributeError("'NoneType' object has no attribute 'hostname'")``. On the lost
connection the consumer first calls ``Connection.collect()``, which closes the channel
and detaches the transport from the connection, then ``connection.close()`` (new in
Celery 5.7, celery/celery#10242 and #10570, for celery/celery#9705). The first close
stops at its opening step, the read of the pending BRPOP, which raises the connection
error (kombu ignores it); the channel is left open. The second close finds it open,
goes on to restore the unacknowledged messages, and that needs the transport's
connection parameters, ``None`` by then: an AttributeError, which nothing catches.

The channel here closes the rest at once when that read fails, while it still has its
transport: the restore then fails with a connection error, which kombu ignores as it
should (the messages stay in Redis's unacked set, restored after the visibility
timeout, as any worker's that dies), and the later close finds the channel closed.
The same two lines belong in kombu's ``Channel.close``; drop this module when a
release has them: ``tests/core/test_broker.py`` fails then (docs/deploying.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kombu.exceptions import OperationalError
from kombu.transport import redis

from .logs import SaidOnce


class Channel(redis.Channel):
    # set by kombu's __init__ (the transport's), left out of its stubs
    connection_errors: tuple[type[BaseException], ...]

    def close(self) -> None:
        try:
            super().close()
        except self.connection_errors:
            if self.closed:
                raise
            # the pending BRPOP's read failed before anything was closed (and marked
            # the poll over): close the rest now
            super().close()


class Transport(redis.Transport):
    Channel = Channel


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
        # the outage as one stretch (no key: a process has one broker)
        self.outage = SaidOnce()
        self.logger_name = ""
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
        elif record.name == "celery.worker.consumer.connection" and self._on():
            record.msg, record.args = f"{message}: {self._back()}", ()  # "Connected to …"
        return True

    def _on(self) -> bool:
        return None in self.outage.stretches

    def _start(self, record: logging.LogRecord) -> None:
        if not self._on():
            self.outage.met()
            self.logger_name = record.name

    def _failed(self, record: logging.LogRecord, meanwhile: str) -> bool:
        if not self.outage.met():
            return False  # counted in the stretch, said when it ends
        self.logger_name = record.name
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
        stretch = self.outage.stretches.pop(None)
        return (
            f"broker answers again after {time.monotonic() - stretch.since:.1f} s "
            f"({stretch.repeats} more failures not logged)"
        )

    def _published(self, **kwargs: object) -> None:
        # beat's first task sent after the outage; the worker's "Connected to" says it there
        if self._on() and self.logger_name == "celery.beat":
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
    return isinstance(exc, OperationalError | OSError)
