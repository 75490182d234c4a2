"""Publish outbox events to Kafka through aiokafka's idempotent producer: at least once, with a
stable event id.

Each outbox stream is a topic; an event's key is its Kafka key (so one key's events share a
partition and keep their order there), its payload the value, and its id the header
``aioqueue-event-id``. The producer is idempotent (``enable_idempotence``, ``acks=all``): the
retries of one producer never write an event twice, and a partition refuses a later send while
an earlier one failed, so a key's events keep their order. A relay that dies after Kafka took a
batch, before its own delete, sends the batch again from a new producer, which Kafka cannot tell
from new events: consumers see such an event twice, with the same id. Since a key's ids grow in
commit order, a consumer that drops an event whose id is not above the last it saw of that key
sees each event once, in order. Needs ``aiokafka`` (``pip install "aioqueue[kafka]"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from aiokafka import AIOKafkaProducer
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('aioqueue.streams.kafka needs aiokafka: pip install "aioqueue[kafka]"') from exc

from . import Event, check_batch

__all__ = ["EVENT_ID_HEADER", "KafkaStream"]

#: The header that carries an event's id (decimal ASCII).
EVENT_ID_HEADER = "aioqueue-event-id"


class KafkaStream:
    """Kafka: the outbox stream ``NAME`` goes to the topic ``prefix + NAME``.

    ``bootstrap_servers``: ``"HOST:PORT[,HOST:PORT...]"``; ``producer_options`` go to
    ``AIOKafkaProducer`` (TLS, SASL, compression), except what the guarantee needs, which is set.
    """

    exactly_once = False

    def __init__(self, bootstrap_servers: str, *, prefix: str = "", **producer_options: Any) -> None:
        if not bootstrap_servers:
            raise ValueError("KafkaStream needs bootstrap servers, such as 'localhost:9092'")
        self.bootstrap_servers = bootstrap_servers
        self.prefix = prefix
        self.options = {**producer_options, "enable_idempotence": True, "acks": "all"}
        self._producer: AIOKafkaProducer | None = None

    async def _started(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers, **self.options)
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def publish(self, events: Sequence[Event]) -> int:
        """Send the events in order and wait until Kafka holds every one."""
        topic = self.prefix + check_batch(events)
        producer = await self._started()
        try:
            sent = [
                await producer.send(
                    topic, value=e.payload.encode(), key=e.key.encode(),
                    headers=[(EVENT_ID_HEADER, str(e.id).encode())],
                )
                for e in events
            ]
            for delivery in sent:
                await delivery
        except BaseException:
            # A producer that failed a send may hold later ones of the batch: start afresh.
            self._producer = None
            await producer.stop()
            raise
        return len(events)

    async def aclose(self) -> None:
        """Flush and stop the producer."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()
