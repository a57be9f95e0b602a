"""webhook_receiver/core/broker.py: kombu's Redis channel that finishes closing when Redis
has gone away. A worker inside an ``acks_late`` task holds a message it has not
acknowledged and waits on BRPOP for the next; Redis stops (a private one, stopped for
real); Celery 5.7's consumer then closes the channel twice, in ``connection.collect()``
(which then detaches the transport) and in ``connection.close()``.

The first test fails once kombu's own channel no longer needs the fix: then drop the
module, the setting that names it (docs/deploying.md) and this file.
(tests/test_broker_outage.py restarts Redis under a real worker of the demo's.)
"""

from __future__ import annotations

from socket import timeout as SocketTimeout
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue
from kombu.transport import redis as kombu_redis

from tests.support.private_servers import PrivateRedis, private_redis  # noqa: F401 (fixture)
from webhook_receiver.core import broker

QUEUE = "broker-close-test"
FIXED = "kombu fixed this: drop webhook_receiver/core/broker.py and this test"


def worker_inside_a_task(url: str, transport: type) -> tuple[Connection, Any]:
    """A connection and its channel as a worker's consumer holds them inside an
    ``acks_late`` task: one message delivered and not acknowledged, a BRPOP pending."""
    connection = Connection(url, transport=transport)
    channel = connection.default_channel
    queue = Queue(QUEUE, channel=channel)
    queue.declare()
    Producer(channel).publish({"task": "a task"}, routing_key=QUEUE)
    delivered: list[object] = []
    consumer = Consumer(channel, [queue], no_ack=False)
    consumer.register_callback(lambda body, message: delivered.append(message))
    consumer.consume()
    connection.drain_events(timeout=5)  # the task's message, not acknowledged
    with pytest.raises(SocketTimeout):
        connection.drain_events(timeout=0.2)  # the BRPOP for the next one, left pending
    assert delivered and channel._in_poll is not None
    return connection, channel


def detached(channel: Any) -> None:
    """The transport detached from the connection, as ``Connection.collect()`` leaves it
    between Celery 5.7's two closes."""
    channel.connection.client = None


def test_kombus_own_redis_channel_still_fails_its_second_close(
    private_redis: PrivateRedis,  # noqa: F811
) -> None:
    _, channel = worker_inside_a_task(private_redis.url, kombu_redis.Transport)
    private_redis.stop()

    # the first close fails on the pending BRPOP's read, before it closes anything
    with pytest.raises(redis.ConnectionError):
        channel.close()
    assert not channel.closed, FIXED
    detached(channel)
    # the second goes on to restore the unacknowledged message, which needs the
    # transport's connection parameters: the worker's "Unrecoverable error"
    try:
        channel.close()
    except AttributeError as exc:
        assert "hostname" in str(exc), FIXED
    else:
        pytest.fail(FIXED)


def test_the_apps_channel_finishes_closing_at_its_first_close(
    private_redis: PrivateRedis,  # noqa: F811
) -> None:
    _, channel = worker_inside_a_task(private_redis.url, broker.Transport)
    private_redis.stop()

    # the restore's connection error, which kombu ignores as it should: the message
    # stays in Redis's unacked set, restored after the visibility timeout
    with pytest.raises(redis.ConnectionError):
        channel.close()
    assert channel.closed
    detached(channel)
    channel.close()  # closed already: nothing left to do
