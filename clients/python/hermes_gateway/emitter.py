"""The event emitter: one Avro request event per upstream attempt to
Kafka, keyed by channel, without ever blocking the gateway.

- Key = ``channel_id`` as UTF-8 and ``partitioner=murmur2_random`` (Kafka's
  default, murmur2, which Java and Go producers use too): every event of a
  channel lands on one partition whatever client produced it.
- ``acks=all`` and idempotence: a retry inside the producer does not
  duplicate an event.
- With ``schema_registry_url`` the value is Confluent-framed by
  confluent-kafka's ``AvroSerializer`` (schema registered under
  ``<topic>-value``); without, a plain Avro datum of the current schema.
  Hermes reads both.
- Bounded: at most ``buffer_events`` events wait in the producer's queue.
  When Kafka is away and the queue is full, ``emit`` drops the event and
  counts it (``dropped``); events that wait longer than ``max_wait_ms`` are
  dropped by the producer and counted (``expired``). Routing never waits
  on the event stream.
"""

from __future__ import annotations

import collections
import io
import json
import logging
import threading

import fastavro
from confluent_kafka import KafkaException, Producer

from .event import attempt, load_schema

log = logging.getLogger("hermes_gateway")


class EventEmitter:
    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = "hermes.requests",
        *,
        schema_registry_url: str | None = None,
        buffer_events: int = 100_000,
        max_wait_ms: int = 300_000,
        producer_config: dict | None = None,
    ):
        self.topic = topic
        self.sent = 0
        self.dropped = 0
        self.expired = 0
        # Events handed to the producer and not yet delivered or expired.
        # `len(producer)` is not it: librdkafka's out-queue length also
        # counts callbacks waiting for `poll` (an `error_cb` per refused
        # connect) and requests waiting for a broker.
        self._in_producer = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._schema_text = load_schema()
        self._parsed = fastavro.parse_schema(json.loads(self._schema_text))
        config = {
            "bootstrap.servers": bootstrap_servers,
            "partitioner": "murmur2_random",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": buffer_events,
            "message.timeout.ms": max_wait_ms,
            "error_cb": lambda err: log.debug("kafka: %s", err),
            "logger": logging.getLogger("hermes_gateway.kafka"),
        }
        config.update(producer_config or {})
        self._producer = Producer(config)
        self._serializer = None
        # Until the registry has answered, framed events wait here (bounded
        # like the producer's queue).
        self._pending: collections.deque = collections.deque()
        self._pending_limit = buffer_events
        self._ready = threading.Event()
        if schema_registry_url is None:
            self._ready.set()
        else:
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.schema_registry.avro import AvroSerializer

            registry = SchemaRegistryClient({"url": schema_registry_url, "timeout": 5})
            self._serializer = AvroSerializer(registry, self._schema_text, conf={"auto.register.schemas": True})
        self._thread = threading.Thread(target=self._run, name="hermes-emitter", daemon=True)
        self._thread.start()

    # -- the gateway's side: never blocks --------------------------------
    def emit(self, event: dict) -> bool:
        """Queues one event (built with :func:`hermes_gateway.attempt`).
        Returns False when it was dropped because the buffer is full."""
        if not self._ready.is_set():
            with self._lock:
                if not self._ready.is_set():
                    if len(self._pending) >= self._pending_limit:
                        self.dropped += 1
                        return False
                    self._pending.append(event)
                    return True
        return self._produce(event)

    def stats(self) -> dict:
        """Counters for the gateway's own metrics."""
        with self._lock:
            return {
                "sent": self.sent,
                "dropped": self.dropped,
                "expired": self.expired,
                "queued": self._in_producer + len(self._pending),
            }

    def close(self, timeout_s: float = 5.0) -> None:
        """Flushes what it can within ``timeout_s`` and stops."""
        self._stop.set()
        self._thread.join(timeout_s)
        self._producer.flush(timeout_s)

    # -- internals -------------------------------------------------------
    def _encode(self, event: dict) -> bytes:
        if self._serializer is not None:
            from confluent_kafka.serialization import MessageField, SerializationContext

            return self._serializer(event, SerializationContext(self.topic, MessageField.VALUE))
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self._parsed, event)
        return buf.getvalue()

    def _produce(self, event: dict) -> bool:
        value = self._encode(event)
        # Counted before `produce`: its delivery report may come first.
        with self._lock:
            self._in_producer += 1
        try:
            self._producer.produce(
                self.topic,
                key=event["channel_id"].encode(),
                value=value,
                on_delivery=self._delivered,
            )
        except BufferError:
            with self._lock:
                self._in_producer -= 1
                self.dropped += 1
            return False
        except KafkaException as e:
            log.warning("hermes event not queued: %s", e)
            with self._lock:
                self._in_producer -= 1
                self.dropped += 1
            return False
        return True

    def _delivered(self, err, _msg) -> None:
        with self._lock:
            self._in_producer -= 1
            if err is None:
                self.sent += 1
            else:
                self.expired += 1

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            if not self._ready.is_set():
                try:
                    # Registers the schema (or looks it up) once; cached after.
                    self._serializer(self._pending[0] if self._pending else _PROBE, _ctx(self.topic))
                except Exception as e:  # the registry is away: keep buffering
                    log.debug("schema registry not reachable yet: %s", e)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                with self._lock:
                    self._ready.set()
                    pending, self._pending = self._pending, collections.deque()
                for event in pending:
                    self._produce(event)
            self._producer.poll(0.1)


def _ctx(topic: str):
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.VALUE)


_PROBE = attempt(
    event_id="schema-probe",
    event_time_ms=0,
    gateway_id="-",
    channel_id="-",
    route_group="-",
    model="-",
    error_class="NONE",
    latency_ms=0,
)
