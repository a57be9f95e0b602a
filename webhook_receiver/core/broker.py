"""Kombu's Redis transport, with a channel that finishes closing when Redis has gone
away. A host whose Celery broker is Redis names it in its settings:
``CELERY_BROKER_TRANSPORT = "webhook_receiver.core.broker:Transport"`` (Celery's
``broker_transport``; the broker URL stays ``redis://…``). It imports kombu alone.

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

from kombu.transport import redis


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
