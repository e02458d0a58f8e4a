"""The LiteLLM *Proxy* on Hermes, end to end, at Hermes' default decision
timing (run by tests/litellm_proxy.rs, which writes the Proxy's config.yaml,
generates hermes.toml's catalogue from it with `hermes catalogue`, and
starts tansu, redis-server and `hermes run`).

The Proxy runs as users run it (`litellm --config config.yaml`, two
workers, a master key) with one line of Hermes configuration:
``litellm_settings.callbacks: ["hermes_gateway.litellm.proxy_handler"]``
and the Hermes addresses in the environment. Callers use the OpenAI Python
client, half of them streaming, with traffic classes in the request
metadata. Four fake OpenAI-compatible upstreams: free-a, free-b, paid-a,
paid-b. Then, with every decision at Hermes' defaults:

1. free-a answers HTTP 200 with truncated output: time until the weights
   drain it, and the bad answers callers still get after that;
2. paid-a answers HTTP 500: time to drain, requests that fail after the
   Proxy's retries;
3. both heal: time until each has weight again (their cool-down and
   probation, minutes at the defaults);
4. free-b answers after 4 s (latency judged against its own baseline,
   learned over its first five healthy minutes): time to drain;
5. Redis is stopped for 30 s (SIGSTOP): no request may fail;
6. Hermes is stopped (SIGTERM): routing goes on by the last snapshot, no
   request may fail.

Prints one JSON report line and exits 1 if any expectation fails.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import redis  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

import processes  # noqa: E402
from fake_upstream import FakeUpstream  # noqa: E402

CHANNELS = ("free-a", "free-b", "paid-a", "paid-b")
CLASSES = ("interactive", "core", "batch")
WORKERS = 12
MASTER_KEY = "sk-hermes-e2e-0123456789abcdef"


def hermes_counts() -> dict:
    """Events Hermes applied and dead-lettered (its /metrics)."""
    out = {"applied": 0.0, "dead_lettered": 0.0}
    try:
        with urllib.request.urlopen("http://" + os.environ["HERMES_E2E_HTTP"] + "/metrics", timeout=2) as r:
            text = r.read().decode()
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("hermes_events_applied_total"):
            out["applied"] += float(value)
        elif name.startswith("hermes_dead_letters_total"):
            out["dead_lettered"] += float(value)
    return out


# Seconds after the first snapshot by which every channel has the five
# completed one-minute baseline windows its relative latency signal needs
# (one more minute for window alignment, and a margin).
BASELINE_WINDOWS_S = 380


class Run:
    def __init__(self):
        ports = json.loads(os.environ["HERMES_E2E_UPSTREAM_PORTS"])
        self.ups = {c: FakeUpstream(c, int(ports[c])) for c in CHANNELS}
        self.port = int(os.environ["HERMES_E2E_PROXY_PORT"])
        self.redis = redis.Redis.from_url(os.environ["HERMES_E2E_REDIS"], socket_timeout=2)
        self.proxy = None
        #: (finished at, outcome) per request: ok, bad (a truncated answer), failed.
        self.results: list[tuple[float, str]] = []
        self.stop = asyncio.Event()
        self.report: dict = {}
        self.failures: list[str] = []

    # -- the Proxy -------------------------------------------------------
    def start_proxy(self):
        env = dict(os.environ)
        env.update({
            "HERMES_BOOTSTRAP_SERVERS": os.environ["HERMES_E2E_BOOTSTRAP"],
            "HERMES_REDIS_URL": os.environ["HERMES_E2E_REDIS"],
            "HERMES_REFRESH_S": "1",
            "LITELLM_MASTER_KEY": MASTER_KEY,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        })
        self.proxy_log = open(os.environ["HERMES_E2E_PROXY_LOG"], "w")
        self.proxy = subprocess.Popen(
            [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", os.environ["HERMES_E2E_CONFIG"],
             "--host", "127.0.0.1", "--port", str(self.port), "--num_workers", "2"],
            env=env, stdout=self.proxy_log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def proxy_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=1) as r:
                return r.status == 200
        except Exception:  # noqa: BLE001
            return False

    def stop_proxy(self):
        if self.proxy is not None and self.proxy.poll() is None:
            os.killpg(self.proxy.pid, signal.SIGTERM)
            try:
                self.proxy.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proxy.pid, signal.SIGKILL)

    # -- callers ---------------------------------------------------------
    async def caller(self, i: int):
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=MASTER_KEY,
                             max_retries=0, timeout=30)
        stream = i % 2 == 1
        cls = CLASSES[i % len(CLASSES)]
        while not self.stop.is_set():
            try:
                text, finish = "", None
                kwargs = dict(model="chat", messages=[{"role": "user", "content": "hello"}],
                              extra_body={"metadata": {"hermes_class": cls}})
                if stream:
                    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                        if chunk.choices:
                            text += chunk.choices[0].delta.content or ""
                            finish = chunk.choices[0].finish_reason or finish
                else:
                    r = await client.chat.completions.create(**kwargs)
                    text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
                outcome = "ok" if finish == "stop" and len(text.split()) > 50 else "bad"
            except Exception:  # noqa: BLE001
                outcome = "failed"
            self.results.append((time.time(), outcome))
            await asyncio.sleep(0.35)
        await client.close()

    # -- what Hermes published ---------------------------------------------
    def snapshot(self):
        try:
            raw = self.redis.get("hermes:{chat}:weights")
        except redis.RedisError:
            return None
        return json.loads(raw) if raw else None

    def weight(self, channel, cls="CORE"):
        snap = self.snapshot()
        if snap is None:
            return None
        return snap["classes"].get(cls, {}).get("weights", {}).get(channel, 0.0)

    async def until(self, pred, timeout_s, what):
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if await asyncio.to_thread(pred):
                return time.time()
            await asyncio.sleep(0.1)
        self.failures.append(f"timed out after {timeout_s} s waiting for {what}")
        return None

    def outcomes(self, t0, t1):
        done = [o for t, o in self.results if t0 <= t < t1]
        return {"requests": len(done), "bad": done.count("bad"), "failed": done.count("failed")}

    def expect(self, cond, message):
        if not cond:
            self.failures.append(message)

    async def fault(self, channel, mode, key, drain_within_s):
        """Turns `channel`'s upstream to `mode`; the time from its first
        bad answer until Hermes' weights drain it, and what callers saw."""
        up = self.ups[channel]
        up.set(mode)
        t_set = time.time()
        await self.until(lambda: up.first_bad_at is not None, 20, f"{channel}'s first {mode} answer")
        t_bad = up.first_bad_at or t_set
        t_drained = await self.until(lambda: self.weight(channel) == 0 and self.weight(channel, "BATCH") == 0,
                                     drain_within_s, f"{channel} drained ({mode})")
        if t_drained is None:
            return None
        await asyncio.sleep(12)
        self.report[key] = {
            "drain_s": round(t_drained - t_bad, 2),
            "until_drained": self.outcomes(t_set, t_drained),
            "after_drain": self.outcomes(t_drained + 2, time.time()),
            f"{channel}_attempts_after_drain": up.served_between(t_drained + 2, time.time()),
        }
        return t_drained

    async def main(self):
        self.start_proxy()
        if await self.until(self.proxy_ready, 180, "the LiteLLM Proxy") is None:
            return await self.finish([])
        tasks = [asyncio.create_task(self.caller(i)) for i in range(WORKERS)]
        t = await self.until(lambda: (self.weight("free-a") or 0) > 0, 240, "Hermes' first snapshot")
        if t is None:
            return await self.finish(tasks)
        self.t_first_snapshot = t
        await asyncio.sleep(10)
        self.report["before"] = self.outcomes(t, time.time())
        self.report["before"]["rps"] = round(self.report["before"]["requests"] / (time.time() - t), 1)

        if await self.fault("free-a", "truncated", "truncated", 120) is None:
            return await self.finish(tasks)
        after = self.report["truncated"]["after_drain"]
        self.expect(after["bad"] <= max(3, 0.02 * after["requests"]),
                    f"{after['bad']} truncated answers of {after['requests']} after free-a was drained")

        if await self.fault("paid-a", "down", "http_500", 60) is None:
            return await self.finish(tasks)
        for phase in ("until_drained", "after_drain"):
            seen = self.report["http_500"][phase]
            self.expect(seen["failed"] <= max(2, 0.01 * seen["requests"]),
                        f"HTTP 500, {phase}: {seen['failed']} of {seen['requests']} failed after the Proxy's retries")

        # Heal: each is let back after its cool-down and probation.
        t_heal = time.time()
        for c in ("free-a", "paid-a"):
            self.ups[c].set("healthy")
        back = {}
        for c in ("free-a", "paid-a"):
            t_back = await self.until(lambda c=c: (self.weight(c) or 0) > 0, 420, f"{c} back in the weights")
            if t_back is None:
                return await self.finish(tasks)
            back[c] = round(t_back - t_heal, 1)
        self.report["healed"] = {"weight_again_s": back, "callers": self.outcomes(t_heal, time.time())}
        self.expect(all(s <= 360 for s in back.values()), f"let back too late: {back}")

        # Latency is judged against free-b's own baseline: five completed
        # one-minute windows (`engine.baseline_min_windows`) before the
        # fault, whatever time the heal above took.
        baseline_s = BASELINE_WINDOWS_S - (time.time() - self.t_first_snapshot)
        if baseline_s > 0:
            await asyncio.sleep(baseline_s)
        if await self.fault("free-b", "slow", "slow", 120) is None:
            return await self.finish(tasks)

        # Redis away: gateways keep the last snapshot.
        redis_pid = int(os.environ["HERMES_E2E_REDIS_PID"])
        os.kill(redis_pid, signal.SIGSTOP)
        t_stop = time.time()
        await asyncio.sleep(30)
        os.kill(redis_pid, signal.SIGCONT)
        seen = self.outcomes(t_stop, time.time())
        self.report["redis_away_30s"] = seen
        self.expect(self.carried_traffic(seen, time.time() - t_stop) and seen["failed"] == 0,
                    f"while Redis was away: {seen['failed']} of {seen['requests']} failed")
        await asyncio.sleep(5)

        # What Hermes made of the Proxy's events.
        counts = await asyncio.to_thread(hermes_counts)
        self.report["hermes_events"] = counts
        self.expect(counts.get("applied", 0) > 1000, f"Hermes applied too few events: {counts}")
        self.expect(counts.get("dead_lettered", 0) == 0, f"events dead-lettered: {counts}")

        # Hermes away: routing goes on by the last good weights (the last
        # it wrote, up to its exit: a graceful stop may still publish).
        t_stop = await asyncio.to_thread(processes.stop, int(os.environ["HERMES_E2E_PID"]))
        before = self.snapshot()
        await asyncio.sleep(30)
        seen = self.outcomes(t_stop, time.time())
        after = self.snapshot()
        self.report["hermes_away_30s"] = {**seen, "version_before": before["version"],
                                          "version_after": after["version"]}
        self.expect(self.carried_traffic(seen, time.time() - t_stop) and seen["failed"] == 0,
                    f"while Hermes was away: {seen['failed']} of {seen['requests']} failed")
        self.expect((after["epoch"], after["version"]) == (before["epoch"], before["version"]),
                    "the weights changed while Hermes was away")
        return await self.finish(tasks)

    def carried_traffic(self, seen, seconds):
        """Whether callers kept sending through a phase, so that its "none
        failed" is not an empty claim: at least half the rate measured
        before the faults in this run (the callers' rate is the machine's:
        a busy machine halves it with no request failing), and never fewer
        than two requests a second."""
        floor = max(2.0, 0.5 * self.report["before"]["rps"]) * seconds
        return seen["requests"] >= floor

    async def finish(self, tasks):
        self.stop.set()
        await asyncio.gather(*tasks)
        self.stop_proxy()
        self.report["requests"] = self.outcomes(0, time.time() + 1)
        self.report["upstream_attempts"] = {c: u.served for c, u in self.ups.items()}
        self.report["failures"] = self.failures
        print(json.dumps(self.report))
        for u in self.ups.values():
            u.stop()
        return not self.failures


if __name__ == "__main__":
    ok = asyncio.run(Run().main())
    sys.exit(0 if ok else 1)
