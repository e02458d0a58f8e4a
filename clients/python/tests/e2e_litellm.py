"""LiteLLM on Hermes, end to end (run by tests/litellm.rs, which starts
tansu, redis-server, a schema registry and `hermes run`, and passes their
addresses and Hermes' PID in the environment).

A LiteLLM Router with three deployments of model group ``chat`` (free-a,
paid-a, paid-b: fake OpenAI-compatible upstreams) routes by Hermes' weights
(HermesRouting) and reports every attempt (HermesLogger). Four workers send
requests continuously. Then:

1. wait for Hermes' first snapshot;
2. free-a starts answering HTTP 200 with truncated output: measure the time
   from its first bad answer until the Router's weights drain it, then how
   much traffic it still gets;
3. free-a fails hard (HTTP 500) for 20 s: count the requests users lose
   (after LiteLLM's retry);
4. free-a heals: measure the time until the Router sends it traffic again;
5. Hermes is stopped (SIGTERM): LiteLLM must keep routing on the last good
   weights, losing no request.

Prints one JSON report line and exits 1 if any expectation fails.
"""

import asyncio
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import hermes_gateway  # noqa: F401  (installed: CI tests the wheel)
except ImportError:
    sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from litellm import Router  # noqa: E402

import processes  # noqa: E402
from fake_upstream import FakeUpstream  # noqa: E402
from hermes_gateway import EventEmitter  # noqa: E402
from hermes_gateway.litellm import HermesLogger, HermesRouting  # noqa: E402

CHANNELS = ("free-a", "paid-a", "paid-b")
WORKERS = 4


def hermes_view():
    """Hermes' own view (its /metrics and /status), for a failure report."""
    import urllib.request

    out = {}
    base = "http://" + os.environ.get("HERMES_E2E_HTTP", "")
    try:
        metrics = urllib.request.urlopen(base + "/metrics", timeout=2).read().decode()
        out["metrics"] = [line for line in metrics.splitlines()
                          if line.startswith(("hermes_events_", "hermes_dead_letters", "hermes_channel_state",
                                              "hermes_channel_score", "hermes_channel_signal"))][:60]
        out["status"] = urllib.request.urlopen(base + "/status", timeout=2).read().decode()[:3000]
    except Exception as e:  # noqa: BLE001
        out["error"] = str(e)
    return out


def hermes_free_a():
    """free-a's state and score as Hermes reports them (None if unreachable)."""
    import urllib.request

    try:
        metrics = urllib.request.urlopen("http://" + os.environ["HERMES_E2E_HTTP"] + "/metrics", timeout=1).read().decode()
    except Exception:  # noqa: BLE001
        return None
    state, score = None, None
    for line in metrics.splitlines():
        if 'channel="free-a"' not in line:
            continue
        if line.startswith("hermes_channel_state{") and line.endswith(" 1.0"):
            state = line.split('state="')[1].split('"')[0]
        elif line.startswith("hermes_channel_score{"):
            score = round(float(line.rsplit(" ", 1)[1]), 2)
    return state, score


class Run:
    def __init__(self):
        self.ups = {c: FakeUpstream(c) for c in CHANNELS}
        self.router = Router(
            model_list=[
                {"model_name": "chat",
                 "litellm_params": {"model": f"openai/m-{c}", "api_base": u.url, "api_key": "x"},
                 "model_info": {"id": c}}
                for c, u in self.ups.items()
            ],
            num_retries=1,
            # LiteLLM's own cool-down would pull a deployment answering 500
            # (not one answering truncated 200s): off, so this measures Hermes.
            disable_cooldowns=True,
        )
        self.emitter = EventEmitter(os.environ["HERMES_E2E_BOOTSTRAP"],
                                    schema_registry_url=os.environ["HERMES_E2E_REGISTRY"])
        self.logger = HermesLogger(self.emitter, "litellm-e2e")
        litellm.callbacks = [self.logger]
        self.routing = HermesRouting(
            self.router, os.environ["HERMES_E2E_REDIS"],
            static={"*": {"free-a": 0.3, "paid-a": 0.35, "paid-b": 0.35}},
            emitter=self.emitter, gateway_id="litellm-e2e",
            stale_after_ms=6_000, refresh_s=1.0,
        )
        self.router.register_plugin(self.routing)
        self.results: list[tuple[float, bool]] = []  # (finished at, succeeded)
        self.stop = asyncio.Event()
        self.report: dict = {}
        self.failures: list[str] = []
        self.timeline: list = []

    async def worker(self):
        while not self.stop.is_set():
            try:
                await self.router.acompletion(model="chat", messages=[{"role": "user", "content": "hello"}])
                ok = True
            except Exception:  # noqa: BLE001
                ok = False
            self.results.append((time.time(), ok))
            await asyncio.sleep(0.02)

    def snapshot(self):
        r = self.routing.readers.get("chat")
        return r.routes().snapshot if r else None

    def weight(self, channel):
        snap = self.snapshot()
        if snap is None:
            return None
        return snap["classes"].get("CORE", {}).get("weights", {}).get(channel, 0.0)

    async def until(self, pred, timeout_s, what):
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if pred():
                return time.time()
            await asyncio.sleep(0.05)
        self.failures.append(f"timed out after {timeout_s} s waiting for {what}")
        self.report["hermes_at_timeout"] = hermes_view()
        return None

    def requests(self, t0, t1):
        done = [ok for t, ok in self.results if t0 <= t < t1]
        return len(done), sum(1 for ok in done if not ok)

    def share(self, channel, t0, t1):
        counts = {c: u.served_between(t0, t1) for c, u in self.ups.items()}
        total = sum(counts.values())
        return counts[channel] / total if total else 0.0, total

    def expect(self, cond, message):
        if not cond:
            self.failures.append(message)

    async def watch(self):
        """free-a, once a second: Hermes' state and score, the Router's
        weight, attempts it served (in the report when something fails)."""
        t0 = time.time()
        last = 0
        while not self.stop.is_set():
            served = self.ups["free-a"].served
            hermes = await asyncio.to_thread(hermes_free_a)
            self.timeline.append((round(time.time() - t0), self.ups["free-a"].mode, hermes, self.weight("free-a"), served - last))
            last = served
            await asyncio.sleep(1)

    async def main(self):
        tasks = [asyncio.create_task(self.worker()) for _ in range(WORKERS)]
        tasks.append(asyncio.create_task(self.watch()))
        free = self.ups["free-a"]
        t = await self.until(lambda: (self.weight("free-a") or 0) > 0, 150, "Hermes' first snapshot")
        if t is None:
            return await self.finish(tasks)
        await asyncio.sleep(5)
        base_share, base_n = self.share("free-a", t, time.time())
        self.report["before"] = {"free_a_share": round(base_share, 3), "requests": base_n}

        # Silent failure: HTTP 200, truncated output.
        free.set("truncated")
        if await self.until(lambda: free.first_bad_at is not None, 10, "free-a's first bad answer") is None:
            return await self.finish(tasks)
        t_bad = free.first_bad_at
        t_drained = await self.until(lambda: self.weight("free-a") == 0, 90, "free-a drained in the Router's weights")
        if t_drained is None:
            return await self.finish(tasks)
        self.report["drain_s"] = round(t_drained - t_bad, 2)
        self.report["bad_answers_served"] = free.served_by_mode.get("truncated", 0)
        await asyncio.sleep(12)
        share, n = self.share("free-a", t_drained + 2, t_drained + 12)
        self.report["drained"] = {"free_a_share": round(share, 3), "requests": n}
        self.expect(share <= 0.10, f"free-a still got {share:.0%} of the traffic after it was drained")

        # Hard failure: HTTP 500.
        free.set("down")
        t_down = time.time()
        await asyncio.sleep(20)
        n, failed = self.requests(t_down, time.time())
        self.report["hard_down"] = {"requests": n, "failed_after_retry": failed,
                                    "free_a_attempts": free.served_between(t_down, time.time())}

        # Heal.
        free.set("healthy")
        t_heal = time.time()
        served_at_heal = free.served_by_mode.get("healthy", 0)
        t_back = await self.until(lambda: (self.weight("free-a") or 0) > 0, 150, "free-a back in the weights")
        if t_back is None:
            return await self.finish(tasks)
        t_traffic = await self.until(lambda: free.served_by_mode.get("healthy", 0) > served_at_heal + 5, 60,
                                     "free-a serving again")
        self.report["recovery_s"] = round(t_back - t_heal, 2)
        if t_traffic:
            self.report["recovery_traffic_s"] = round(t_traffic - t_heal, 2)
        await asyncio.sleep(5)

        # Hermes stops: routing goes on by the last good weights (the last
        # it wrote, up to its exit: a graceful stop may still publish).
        t_stop = await asyncio.to_thread(processes.stop, int(os.environ["HERMES_E2E_PID"]))
        before = self.snapshot()
        await asyncio.sleep(15)
        n, failed = self.requests(t_stop, time.time())
        status = self.routing.readers["chat"].status()
        after = self.snapshot()
        self.report["hermes_stopped"] = {
            "requests": n, "failed": failed,
            "version_before": before["version"], "version_after": after["version"],
            "reader_stale": status["stale"], "snapshot_age_ms": status["age_ms"],
            "shares": {c: round(self.share(c, t_stop, time.time())[0], 3) for c in CHANNELS},
        }
        self.expect(n >= 50 and failed == 0, f"while Hermes was stopped: {failed} of {n} requests failed")
        self.expect((after["epoch"], after["version"]) == (before["epoch"], before["version"]),
                    "the weights changed while Hermes was stopped")
        self.expect(status["stale"], "the reader should alarm on a stale snapshot")
        return await self.finish(tasks)

    async def finish(self, tasks):
        self.stop.set()
        await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)
        self.emitter.close(10)
        stats = self.emitter.stats()
        self.report["events"] = {"attempts_logged": self.logger.events, **stats}
        self.report["requests"] = {"total": len(self.results), "failed": sum(1 for _, ok in self.results if not ok)}
        self.expect(stats["dropped"] == 0 and stats["expired"] == 0, f"events lost on the way to Kafka: {stats}")
        self.report["failures"] = self.failures
        if self.failures:
            self.report["timeline"] = self.timeline
        print(json.dumps(self.report))
        self.routing.close()
        for u in self.ups.values():
            u.stop()
        return not self.failures


if __name__ == "__main__":
    ok = asyncio.run(Run().main())
    sys.exit(0 if ok else 1)
