"""The emitter never blocks the gateway: with Kafka away it keeps a bounded
buffer and counts what it drops."""

import socket
import time

from hermes_gateway import EventEmitter, attempt


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ev(i):
    return attempt(channel_id=f"c-{i % 7}", route_group="chat", model="m", gateway_id="gw",
                   error_class="NONE", latency_ms=100)


def test_with_kafka_away_the_buffer_is_bounded_and_drops_are_counted():
    em = EventEmitter(f"127.0.0.1:{closed_port()}", buffer_events=100, max_wait_ms=60_000)
    started = time.monotonic()
    accepted = sum(em.emit(ev(i)) for i in range(2_000))
    elapsed = time.monotonic() - started
    stats = em.stats()
    assert accepted == 100 and stats["dropped"] == 1_900, stats
    assert stats["queued"] == 100 and stats["sent"] == 0
    # Blocking would take the producer's timeout (60 s) per event.
    assert elapsed < 10, f"emit blocked: {elapsed:.1f} s for 2 000 events"
    em.close(timeout_s=0.1)


def test_events_that_wait_too_long_are_counted_as_expired():
    em = EventEmitter(f"127.0.0.1:{closed_port()}", buffer_events=1_000, max_wait_ms=1_000)
    for i in range(50):
        em.emit(ev(i))
    deadline = time.time() + 15
    while time.time() < deadline and em.stats()["expired"] < 50:
        time.sleep(0.1)
    assert em.stats()["expired"] == 50, em.stats()
    em.close(timeout_s=0.1)


def test_with_the_registry_away_events_wait_in_the_bounded_buffer():
    em = EventEmitter(f"127.0.0.1:{closed_port()}", buffer_events=10,
                      schema_registry_url=f"http://127.0.0.1:{closed_port()}")
    accepted = sum(em.emit(ev(i)) for i in range(25))
    assert accepted == 10 and em.stats()["dropped"] == 15, em.stats()
    em.close(timeout_s=0.1)
