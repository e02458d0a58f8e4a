"""Hermes for gateways written in Python: emit one Avro request event per
upstream attempt (:class:`EventEmitter`), and route by the weights Hermes
publishes in Redis (:class:`WeightReader`). ``hermes_gateway.litellm`` wires
both into LiteLLM. The contract: docs/integration.md."""

from .emitter import EventEmitter
from .event import attempt, error_class_for_status
from .reader import WeightReader
from .snapshot import CLASSES, InvalidSnapshot, Pick, Routes, View, normalize_class, parse

__all__ = [
    "CLASSES",
    "EventEmitter",
    "InvalidSnapshot",
    "Pick",
    "Routes",
    "View",
    "WeightReader",
    "attempt",
    "error_class_for_status",
    "normalize_class",
    "parse",
]
