"""The weight reader conformance cases (schemas/conformance/) against the
Python client: the same files the Rust client is tested with."""

import glob
import json
import os

import pytest

from hermes_gateway.snapshot import View

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CASES = sorted(glob.glob(os.path.join(REPO, "schemas", "conformance", "*.json")))


def grid_distribution(routes, cls, ns=40, n=400):
    counts = {}
    for s in range(ns):
        u_shed = (s + 0.5) / ns
        for i in range(n):
            p = routes.pick(cls, u_shed, (i + 0.5) / n)
            key = p.channel if p.outcome == "SENT" else p.outcome
            counts[key] = counts.get(key, 0) + 1
    return {k: v / (ns * n) for k, v in counts.items()}


def test_there_are_cases():
    assert len(CASES) >= 10


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p)[:-5] for p in CASES])
def test_case(path):
    case = json.load(open(path))
    known = case["known_channels"]
    view = View(case["static"], frozenset(known) if known is not None else None, case["stale_after_ms"])
    for read in case["reads"]:
        raw = read["raw"] if "raw" in read else (None if read["value"] is None else json.dumps(read["value"]))
        view.offer(raw)
    expect = case["expect"]
    routes = view.routes()
    assert routes.source == expect["source"]
    assert (routes.snapshot or {}).get("version") == expect["version"]
    assert view.is_stale(case["now_ms"]) == expect["stale"]
    assert view.rejected == expect["rejected"]
    for cls, want in expect["distribution"].items():
        exact = routes.distribution(cls)
        sampled = grid_distribution(routes, cls)
        for got in (exact, sampled):
            for k in set(got) | set(want):
                assert abs(got.get(k, 0.0) - want.get(k, 0.0)) <= 0.01, (cls, k, got, want)
