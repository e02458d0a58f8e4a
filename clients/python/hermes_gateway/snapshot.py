"""The weight reader's algorithm, without I/O: validate a snapshot, keep the
newest good one, fall back to a static table, and pick a channel by weight.

Everything here is pure and deterministic (picks take the caller's uniform
numbers), so the same conformance fixtures (``schemas/conformance/``) run
against this module and against the Rust client.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Mapping

import jsonschema

#: The traffic classes of the wire (the snapshot's class keys, the event enum).
CLASSES = ("INTERACTIVE", "CORE", "BATCH", "EXPERIMENTAL")
#: What a request of no known class is routed and reported as.
DEFAULT_CLASS = "CORE"


def _load_schema() -> dict:
    text = resources.files(__package__).joinpath("schemas/weight_snapshot.schema.json").read_text()
    return json.loads(text)


_VALIDATOR = jsonschema.Draft202012Validator(_load_schema())


class InvalidSnapshot(ValueError):
    """A value read from Redis that is not a snapshot this reader may use."""


def parse(raw: str | bytes) -> dict:
    """Parses and validates one value of ``hermes:{GROUP}:weights``.

    Raises :class:`InvalidSnapshot` with the first problem found; a snapshot
    that fails here must never replace a good one.
    """
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidSnapshot(f"not JSON: {e}") from None
    errors = sorted(_VALIDATOR.iter_errors(value), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        raise InvalidSnapshot(f"{where}: {first.message}")
    return value


def is_older(a: dict, b: dict) -> bool:
    """Whether snapshot ``a`` is older than ``b`` (by epoch, then version)."""
    return (a["epoch"], a["version"]) < (b["epoch"], b["version"])


def normalize_class(label: str | None, mapping: Mapping[str, str] | None = None) -> str:
    """The wire class for a gateway's own label: through ``mapping`` first
    (gateway label -> Hermes class, any case), then the label itself if it
    names a class (``interactive`` and ``INTERACTIVE`` alike), else CORE."""
    if label is None:
        return DEFAULT_CLASS
    if mapping and label in mapping:
        label = mapping[label]
    upper = str(label).upper()
    return upper if upper in CLASSES else DEFAULT_CLASS


class Weights:
    """One class's weighted pick: O(log n) by cumulative weights."""

    def __init__(self, weights: Mapping[str, float], known: frozenset[str] | None = None):
        items = sorted(
            (c, float(w))
            for c, w in weights.items()
            if w > 0 and math.isfinite(w) and (known is None or c in known)
        )
        self.channels = [c for c, _ in items]
        total = sum(w for _, w in items)
        self.cumulative: list[float] = []
        acc = 0.0
        for _, w in items:
            acc += w / total
            self.cumulative.append(acc)

    def __bool__(self) -> bool:
        return bool(self.channels)

    def pick(self, u: float) -> str:
        i = bisect.bisect_right(self.cumulative, u)
        return self.channels[min(i, len(self.channels) - 1)]

    def shares(self) -> dict[str, float]:
        prev, out = 0.0, {}
        for c, acc in zip(self.channels, self.cumulative):
            out[c] = acc - prev
            prev = acc
        return out


@dataclass(frozen=True)
class Pick:
    """What to do with one request: ``channel`` is set when it is sent;
    otherwise ``outcome`` is ``SHED`` or ``NO_CHANNEL`` (report it with that
    ``dispatch``)."""

    outcome: str  # "SENT", "SHED" or "NO_CHANNEL"
    channel: str | None
    source: str  # "snapshot" or "static"


@dataclass
class Routes:
    """A table ready for picks: per class, its shed share and its weights."""

    source: str
    snapshot: dict | None
    shed: dict[str, float] = field(default_factory=dict)
    weights: dict[str, Weights] = field(default_factory=dict)

    @staticmethod
    def from_snapshot(snap: dict, known: frozenset[str] | None = None) -> "Routes":
        r = Routes(source="snapshot", snapshot=snap)
        for cls, cw in snap["classes"].items():
            r.shed[cls] = min(max(float(cw["shed"]), 0.0), 1.0)
            r.weights[cls] = Weights(cw["weights"], known)
        return r

    @staticmethod
    def from_static(table: Mapping[str, Mapping[str, float]], known: frozenset[str] | None = None) -> "Routes":
        """A static table: class -> channel -> weight (class ``*`` for every
        class not named)."""
        r = Routes(source="static", snapshot=None)
        default = table.get("*")
        for cls in CLASSES:
            w = table.get(cls, default)
            if w is not None:
                r.shed[cls] = 0.0
                r.weights[cls] = Weights(w, known)
        return r

    def pick(self, cls: str, u_shed: float, u: float) -> Pick:
        if u_shed < self.shed.get(cls, 0.0):
            return Pick("SHED", None, self.source)
        w = self.weights.get(cls)
        if not w:
            return Pick("NO_CHANNEL", None, self.source)
        return Pick("SENT", w.pick(u), self.source)

    def pick_among(self, cls: str, u_shed: float, u: float, allowed, avoid=()) -> Pick:
        """:meth:`pick` restricted to the channels in ``allowed`` (the ones
        the gateway can send to now), preferring those not in ``avoid`` (the
        ones that already failed this request) while one of them has
        weight."""
        if u_shed < self.shed.get(cls, 0.0):
            return Pick("SHED", None, self.source)
        w = self.weights.get(cls)
        shares = w.shares() if w else {}
        for keep in (lambda c: c in allowed and c not in avoid, lambda c: c in allowed):
            left = {c: s for c, s in shares.items() if keep(c)}
            if left:
                return Pick("SENT", Weights(left).pick(u), self.source)
        return Pick("NO_CHANNEL", None, self.source)

    def distribution(self, cls: str) -> dict[str, float]:
        """The exact share of requests of ``cls`` each outcome gets: channel
        ids, ``SHED`` and ``NO_CHANNEL``."""
        shed = self.shed.get(cls, 0.0)
        out = {"SHED": shed} if shed > 0 else {}
        w = self.weights.get(cls)
        if not w:
            if shed < 1.0:
                out["NO_CHANNEL"] = 1.0 - shed
            return out
        for c, s in w.shares().items():
            out[c] = s * (1.0 - shed)
        return out


class View:
    """The reader's state: the newest good snapshot, its routes, and the
    static table used until a first snapshot arrives.

    ``offer`` takes what one read returned (the raw value, or ``None`` when
    the key does not exist); it never lets an invalid or older snapshot
    replace a good one. ``routes()`` is the table to pick from: the last good
    snapshot whatever its age (stale beats empty), else the static table.
    """

    def __init__(
        self,
        static: Mapping[str, Mapping[str, float]] | None = None,
        known_channels: frozenset[str] | None = None,
        stale_after_ms: int = 30_000,
    ):
        self.known = known_channels
        self.stale_after_ms = stale_after_ms
        self.static = Routes.from_static(static or {}, known_channels)
        self.current: Routes | None = None
        self.rejected = 0
        self.last_error: str | None = None

    def offer(self, raw: str | bytes | None) -> bool:
        """Returns whether the table in use changed."""
        if raw is None:
            return False
        try:
            snap = parse(raw)
        except InvalidSnapshot as e:
            self.rejected += 1
            self.last_error = str(e)
            return False
        if self.current is not None and is_older(snap, self.current.snapshot):
            return False
        if self.current is not None and (snap["epoch"], snap["version"], snap["heartbeat_ms"]) == (
            self.current.snapshot["epoch"],
            self.current.snapshot["version"],
            self.current.snapshot["heartbeat_ms"],
        ):
            return False
        self.current = Routes.from_snapshot(snap, self.known)
        return True

    def routes(self) -> Routes:
        return self.current if self.current is not None else self.static

    def age_ms(self, now_ms: int) -> int | None:
        """Milliseconds since the writer's last heartbeat, if a snapshot is held."""
        if self.current is None:
            return None
        return now_ms - self.current.snapshot["heartbeat_ms"]

    def is_stale(self, now_ms: int) -> bool:
        """Whether to alarm: no fresh snapshot (none at all, or its heartbeat
        older than ``stale_after_ms``). Routing goes on regardless."""
        age = self.age_ms(now_ms)
        return age is None or age > self.stale_after_ms
