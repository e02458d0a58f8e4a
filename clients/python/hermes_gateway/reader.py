"""The weight reader: keeps one route group's snapshot fresh from Redis and
picks a channel per request, following docs/integration.md#reading-weights.

A background thread reads ``hermes:{GROUP}:weights`` with one ``GET`` at
start, again on every message on ``hermes:{GROUP}:changed`` and every
``refresh_s`` in case one was missed. Each value goes through
:class:`hermes_gateway.snapshot.View`: validated against
``schemas/weight_snapshot.schema.json``, never older than the one in use.
While Redis is unreachable the thread retries with backoff and routing goes
on by the last good snapshot (stale beats empty); before the first one, by
the gateway's static table. ``status()`` says how stale the view is.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Mapping

import redis

from .snapshot import Pick, Routes, View, normalize_class

log = logging.getLogger("hermes_gateway")


def snapshot_key(group: str) -> str:
    return f"hermes:{{{group}}}:weights"


def changed_channel(group: str) -> str:
    return f"hermes:{{{group}}}:changed"


class WeightReader:
    def __init__(
        self,
        redis_url: str,
        group: str,
        *,
        static: Mapping[str, Mapping[str, float]] | None = None,
        known_channels: set[str] | frozenset[str] | None = None,
        class_mapping: Mapping[str, str] | None = None,
        stale_after_ms: int = 30_000,
        refresh_s: float = 5.0,
        timeout_s: float = 2.0,
        rng: random.Random | None = None,
    ):
        self.group = group
        self.class_mapping = dict(class_mapping or {})
        self.refresh_s = refresh_s
        self.read_errors = 0
        self.last_read_ms: int | None = None
        self._view = View(static, frozenset(known_channels) if known_channels else None, stale_after_ms)
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._redis = redis.Redis.from_url(
            redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hermes-weights-{group}", daemon=True)
        self._thread.start()

    # -- the gateway's side ----------------------------------------------
    @property
    def known_channels(self) -> frozenset[str]:
        return self._view.known or frozenset()

    def offer(self, raw: str | bytes | None) -> bool:
        """Feeds one value as if read from Redis (tests, or a gateway that
        reads the key itself)."""
        return self._view.offer(raw)

    def routes(self) -> Routes:
        """The table in use (an atomic reference: safe from any thread)."""
        return self._view.routes()

    def pick(self, label: str | None = None) -> Pick:
        """Where to send a request of the gateway's class ``label`` (mapped
        to a Hermes class; CORE when unknown)."""
        cls = normalize_class(label, self.class_mapping)
        with self._lock:
            u_shed, u = self._rng.random(), self._rng.random()
        return self.routes().pick(cls, u_shed, u)

    def pick_among(self, label: str | None, allowed, avoid=()) -> Pick:
        """:meth:`pick` among the channels in ``allowed``, avoiding those in
        ``avoid`` while another has weight (a retry)."""
        cls = normalize_class(label, self.class_mapping)
        with self._lock:
            u_shed, u = self._rng.random(), self._rng.random()
        return self.routes().pick_among(cls, u_shed, u, allowed, avoid)

    def status(self) -> dict:
        now = int(time.time() * 1000)
        routes = self.routes()
        snap = routes.snapshot
        return {
            "source": routes.source,
            "version": snap["version"] if snap else None,
            "epoch": snap["epoch"] if snap else None,
            "age_ms": self._view.age_ms(now),
            "stale": self._view.is_stale(now),
            "read_errors": self.read_errors,
            "rejected": self._view.rejected,
            "last_error": self._view.last_error,
        }

    def wait_for_snapshot(self, timeout_s: float) -> bool:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.routes().source == "snapshot":
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._redis.close()

    # -- the background reader ---------------------------------------------
    def _read(self) -> None:
        raw = self._redis.get(snapshot_key(self.group))
        self.last_read_ms = int(time.time() * 1000)
        if self._view.offer(raw):
            log.debug("hermes weights for %s: version %s", self.group, self._view.current.snapshot["version"])

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(changed_channel(self.group))
                self._read()
                backoff = 0.1
                next_refresh = time.monotonic() + self.refresh_s
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=min(0.5, self.refresh_s))
                    if msg is not None or time.monotonic() >= next_refresh:
                        self._read()
                        next_refresh = time.monotonic() + self.refresh_s
            except (redis.RedisError, OSError) as e:
                self.read_errors += 1
                log.debug("hermes weights for %s: redis unreachable (%s); keeping the last snapshot", self.group, e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        pass
