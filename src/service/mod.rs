//! `hermes run`: the service.
//!
//! ```text
//!                 hermes.requests (key = channel)
//!                          │ consumer group `hermes`
//!        ┌─────────────────┴───────────────────┐
//!   instance A: partitions 0,1            instance B: partition 2
//!   one Engine per partition              one Engine per partition
//!   (windows, signals, state machine)     ...
//!        │ alerts ──► hermes.alerts        │
//!        │ bad records ──► hermes.dead-letters
//!        │ state machines ──► Redis hermes:{G}:state (restore on takeover)
//!        └──► hermes.health (key = group) ◄┘
//!                          │ every instance reads all of it (GroupBoard);
//!                          │ its own reports it takes in process instead
//!   the owner of request partition writer_partition(G) = G's only writer:
//!              GroupBoard → Scheduler → fenced Lua write
//!                          ▼
//!            Redis hermes:{G}:weights + PUBLISH hermes:{G}:changed
//! ```
//!
//! Three loops share a process: the request loop on its own OS thread
//! (`requests`), the group writer (`groups`) and the HTTP endpoint
//! (`metrics`) on the tokio runtime, plus the state-store writer and the
//! config watcher. Any loop failing stops the process with an error: what it
//! had not committed is handled again by the instance that takes over.

pub(crate) mod groups;
pub(crate) mod http;
pub(crate) mod kafka;
pub(crate) mod metrics;
pub mod overrides;
pub(crate) mod ownership;
pub(crate) mod partition;
pub(crate) mod rebalance;
pub(crate) mod registry;
mod request_path;
pub(crate) mod requests;
pub mod state_store;
pub mod status;
pub(crate) mod topics;

pub use kafka::read_alerts;
pub use request_path::{RequestPath, Verdicts};

use crate::config::{Config, ConfigFile, Runtime};
use crate::publish::redact_url;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A lock on state an instance's loops share. A loop that panicked while
/// holding it left the data as it was mid-update, which is still the best
/// there is (counters, ownership, fetched schemas): the other loops go on.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Validates what `hermes run` needs beyond a valid engine config.
pub fn check_runnable(rt: &Runtime) -> Result<(), crate::config::ConfigError> {
    use crate::config::{ConfigError, ConfigIssue};
    let mut issues = Vec::new();
    if rt.kafka.brokers.trim().is_empty() {
        issues.push(ConfigIssue {
            key: "kafka.brokers".into(),
            reason: "empty: `hermes run` needs a Kafka cluster (try `hermes demo` for the \
                     embedded one)"
                .into(),
        });
    }
    if rt.redis.url.trim().is_empty() {
        issues.push(ConfigIssue {
            key: "redis.url".into(),
            reason: "empty: `hermes run` publishes weights to Redis".into(),
        });
    }
    if issues.is_empty() {
        Ok(())
    } else {
        Err(ConfigError { issues })
    }
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Re-reads the file when it changes and sends its policy on. An invalid
/// file is refused with every issue logged and the running policy stays;
/// `[kafka]`, `[redis]` and `[service]` are the frozen [`Runtime`]: a change
/// there is logged and waits for a restart. A window-shape change is
/// refused; everything else applies live.
async fn watch_config(
    path: PathBuf,
    runtime: Arc<Runtime>,
    tx: tokio::sync::watch::Sender<Arc<Config>>,
    metrics: Arc<metrics::Metrics>,
) {
    let every = runtime.service.reload_check_ms;
    if every <= 0 {
        return;
    }
    let mut last = modified(&path);
    let mut tick = tokio::time::interval(Duration::from_millis(every as u64));
    loop {
        tick.tick().await;
        let now = modified(&path);
        if now == last {
            continue;
        }
        last = now;
        let file = match ConfigFile::from_file(&path) {
            Ok(file) => file,
            Err(e) => {
                metrics::Metrics::inc(&metrics.config_reload_rejected);
                tracing::error!(path = %path.display(), "config reload refused, the running config stays:\n{e}");
                continue;
            }
        };
        for w in &file.warnings {
            tracing::warn!(path = %path.display(), "{w}");
        }
        let held = runtime.changed_in(&file.runtime);
        if !held.is_empty() {
            tracing::warn!(
                sections = ?held,
                "restart-only settings changed: they take effect at the next restart, the running values stay"
            );
        }
        let old = tx.borrow().clone();
        let new = file.policy;
        if new == *old {
            continue;
        }
        if new.engine != old.engine {
            metrics::Metrics::inc(&metrics.config_reload_rejected);
            tracing::error!("config reload refused: [engine] (window shape) changes need a restart; the running config stays");
            continue;
        }
        metrics::Metrics::inc(&metrics.config_reloads);
        tracing::info!(path = %path.display(), "config reloaded");
        let _ = tx.send(Arc::new(new));
    }
}

/// Health reports queued for this process's group writers.
const LOCAL_REPORTS: usize = 4096;

/// Host, process and, from the second service a process starts (tests, the
/// demo), its number: a writer skips the health reports of its own instance
/// on the topic, so no two services may share a name.
fn instance_id() -> String {
    static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "hermes".into());
    match STARTED.fetch_add(1, Ordering::Relaxed) {
        0 => format!("{host}-{}", std::process::id()),
        n => format!("{host}-{}-{n}", std::process::id()),
    }
}

/// Where the service writes weights and keeps durable state.
#[derive(Clone)]
pub enum Store {
    /// Weights, epochs and state machines in Redis (`redis.url`).
    Redis,
    /// Weights in process, no durable state (the embedded demo).
    InProcess(Arc<crate::publish::InProcessStore>),
}

/// A running service: its loops, and how to stop it.
pub struct Service {
    pub metrics: Arc<metrics::Metrics>,
    /// Operator overrides: set, clear, list (the control API's back end).
    pub control: Arc<overrides::Control>,
    stop: CancellationToken,
    done: tokio::sync::mpsc::UnboundedReceiver<(&'static str, anyhow::Result<()>)>,
    request_threads: Vec<std::thread::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Where the HTTP API listens (`service.http_listen`, its port resolved
    /// when it was 0); `None` when it is off.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Service {
    /// Starts every loop on the current runtime (multi-threaded). With a
    /// `config_path`, the file is watched and reloaded on change.
    pub async fn start(
        file: ConfigFile,
        store: Store,
        config_path: Option<PathBuf>,
    ) -> anyhow::Result<Service> {
        let instance = instance_id();
        log_start(&instance, &file);
        let ConfigFile {
            policy: cfg,
            runtime,
            warnings,
        } = file;
        warnings
            .iter()
            .for_each(|w| tracing::warn!(config = ?config_path, "{w}"));
        let runtime = Arc::new(runtime);
        let metrics = Arc::new(metrics::Metrics::default());
        let stop = CancellationToken::new();
        let (cfg_tx, cfg_rx) = tokio::sync::watch::channel(Arc::new(cfg.clone()));
        let mut tasks = Vec::new();
        let control = start_control(&store, &runtime, &cfg_rx, &stop, &mut tasks).await?;
        let http_addr = serve_http(&runtime, &metrics, &control, &mut tasks).await?;
        // Alerts carry the registered id from the first one on.
        let registered = registry::register_schemas(&runtime.kafka, &metrics, stop.clone()).await?;
        spawn_watchers(&runtime, &metrics, &stop, config_path, cfg_tx, &mut tasks);
        let check_every = Duration::from_millis(cfg.engine.evaluation_interval_ms as u64);
        let (state_store, sink) = stores(&store, &runtime, &instance, check_every)?;
        let producer = Arc::new(
            kafka::output_producer(&runtime.kafka, metrics.clone())
                .context("creating the producer")?,
        );
        // Health reports for this process's writers; they are small and
        // few (one per group and partition per tick, and one per state
        // change), so this holds minutes of them.
        let (local_tx, local_rx) = tokio::sync::mpsc::channel(LOCAL_REPORTS);
        let parts = requests::LoopParts {
            cfg_rx,
            runtime: runtime.clone(),
            ownership: Arc::new(ownership::Ownership::default()),
            store: state_store,
            producer,
            rt: tokio::runtime::Handle::current(),
            metrics: metrics.clone(),
            instance,
            stop: stop.clone(),
            overrides: control.subscribe(),
            alert_schema_id: registered.alert_schema_id,
            local_reports: local_tx,
            lane: 0,
            dead_letters: Arc::new(std::sync::Mutex::new(crate::alert::DeadLetterRule::new(
                cfg.alerts.clone(),
            ))),
            lost: Arc::default(),
            schemas: Arc::default(),
            leaving: Arc::default(),
        };
        let group_loop = groups::GroupLoopParts::beside(&parts, sink, local_rx);
        let request_loops =
            requests::RequestLoop::per_lane(runtime.service.request_loops(), parts)?;
        let (done_tx, done) = tokio::sync::mpsc::unbounded_channel();
        let request_threads = spawn_loops(request_loops, group_loop, done_tx, &mut tasks)?;
        Ok(Service {
            metrics,
            control,
            stop,
            done,
            request_threads,
            tasks,
            http_addr,
        })
    }

    /// Waits until a loop stops (an error, unless asked to stop).
    pub async fn failed(&mut self) -> anyhow::Error {
        match self.done.recv().await {
            Some((what, Ok(()))) => anyhow::anyhow!("{what} stopped"),
            Some((what, Err(e))) => e.context(format!("{what} failed")),
            None => anyhow::anyhow!("every loop stopped"),
        }
    }

    /// Stops every loop: the request loop commits what it handled first.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        for t in std::mem::take(&mut self.request_threads) {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        for t in &self.tasks {
            t.abort();
        }
        log_stop(&self.metrics);
        // A loop that failed on its way out says so.
        while let Ok((what, r)) = self.done.try_recv() {
            r.with_context(|| format!("{what} failed"))?;
        }
        Ok(())
    }
}

/// The operators' overrides, read once before the loops start (a group
/// taken over is frozen before its first write) and kept fresh by a task;
/// Redis down: that task keeps trying.
/// The tasks beside the loops: the topics' check, and the config file's
/// watcher (when the config came from a file).
fn spawn_watchers(
    runtime: &Arc<Runtime>,
    metrics: &Arc<metrics::Metrics>,
    stop: &CancellationToken,
    config_path: Option<PathBuf>,
    cfg_tx: tokio::sync::watch::Sender<Arc<Config>>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    tasks.push(tokio::spawn(topics::ensure(
        runtime.kafka.clone(),
        metrics.clone(),
        stop.clone(),
    )));
    if let Some(path) = config_path {
        tasks.push(tokio::spawn(watch_config(
            path,
            runtime.clone(),
            cfg_tx,
            metrics.clone(),
        )));
    }
}

async fn start_control(
    store: &Store,
    runtime: &Runtime,
    cfg_rx: &tokio::sync::watch::Receiver<Arc<Config>>,
    stop: &CancellationToken,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Arc<overrides::Control>> {
    let control = Arc::new(overrides::Control::new(
        match store {
            Store::Redis => overrides::Store::redis(&runtime.redis.url)?,
            Store::InProcess(_) => overrides::Store::InProcess(Default::default()),
        },
        cfg_rx.clone(),
        runtime.service.override_tombstone_ms,
    ));
    if let Err(e) = control.refresh().await {
        tracing::warn!(error = %e, "operator overrides not read yet; retrying");
    }
    tasks.push(tokio::spawn(overrides::sync(
        control.clone(),
        Duration::from_millis(runtime.service.override_poll_ms as u64),
        stop.clone(),
    )));
    Ok(control)
}

/// The HTTP API on `service.http_listen` (none when it is empty): where it
/// listens, its port resolved when it was 0.
async fn serve_http(
    runtime: &Runtime,
    metrics: &Arc<metrics::Metrics>,
    control: &Arc<overrides::Control>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let listen = &runtime.service.http_listen;
    if listen.is_empty() {
        return Ok(None);
    }
    let l = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = l
        .local_addr()
        .with_context(|| format!("binding {listen}"))?;
    tracing::info!(listen = %addr, "serving /metrics, /status, /healthz, /readyz and /v1/overrides");
    let api = http::Api {
        metrics: metrics.clone(),
        control: control.clone(),
        token: runtime.service.control_token(),
    };
    tasks.push(tokio::spawn(http::serve(l, api)));
    Ok(Some(addr))
}

/// Where state machines are kept and weights written, for `store`.
fn stores(
    store: &Store,
    runtime: &Runtime,
    instance: &str,
    check_every: Duration,
) -> anyhow::Result<(Option<state_store::StateStore>, groups::WeightSink)> {
    Ok(match store {
        Store::Redis => (
            Some(state_store::StateStore::start(
                &runtime.redis.url,
                instance,
                check_every,
            )?),
            groups::redis_sink(runtime)?,
        ),
        Store::InProcess(s) => (None, groups::WeightSink::InProcess(s.clone())),
    })
}

fn log_start(instance: &str, file: &ConfigFile) {
    let (cfg, rt) = (&file.policy, &file.runtime);
    tracing::info!(
        instance,
        brokers = %rt.kafka.brokers,
        requests = %rt.kafka.request_topic,
        health = %rt.kafka.health_topic,
        alerts = %rt.kafka.alert_topic,
        dead_letters = %rt.kafka.dead_letter_topic,
        kafka_properties = %kafka::loggable_properties(&rt.kafka),
        redis = %redact_url(&rt.redis.url),
        groups = cfg.groups.len(),
        channels = cfg.channels().count(),
        allocator = %crate::allocator::describe(),
        "hermes starting"
    );
}

/// What this instance handled over its life, once its request loops
/// stopped: a rolling upgrade's accounting (records of a partition that
/// moved are counted by each owner that applied them).
fn log_stop(m: &metrics::Metrics) {
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    tracing::info!(
        consumed = n(&m.events_consumed),
        applied = n(&m.events_applied),
        replayed = n(&m.events_replayed),
        duplicates = n(&m.duplicates),
        too_late = n(&m.too_late),
        dead_lettered = m.dead_letters_total(),
        commits = n(&m.commits),
        "hermes stopped"
    );
}

type Done = tokio::sync::mpsc::UnboundedSender<(&'static str, anyhow::Result<()>)>;

/// Each request loop on its own OS thread, the group writer on the
/// runtime; each says on `done` when it stops, and why.
fn spawn_loops(
    request_loops: Vec<requests::RequestLoop>,
    group_loop: groups::GroupLoopParts,
    done: Done,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::new();
    for (lane, request_loop) in request_loops.into_iter().enumerate() {
        let tx = done.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("hermes-requests-{lane}"))
                .spawn(move || {
                    let r = request_loop.run();
                    let _ = tx.send(("request loop", r));
                })?,
        );
    }
    tasks.push(tokio::spawn(async move {
        let r = groups::run(group_loop).await;
        let _ = done.send(("group writer", r));
    }));
    Ok(threads)
}

/// Runs the service until SIGINT/SIGTERM or a loop fails.
pub async fn run(config_path: &Path) -> anyhow::Result<()> {
    let file =
        ConfigFile::from_file(config_path).with_context(|| format!("{}", config_path.display()))?;
    check_runnable(&file.runtime)?;
    let mut service = Service::start(file, Store::Redis, Some(config_path.to_path_buf())).await?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let failed = tokio::select! {
        _ = tokio::signal::ctrl_c() => { tracing::info!("interrupted; stopping"); None }
        _ = sigterm.recv() => { tracing::info!("terminated; stopping"); None }
        e = service.failed() => Some(e),
    };
    let stopped = service.stop().await;
    match failed {
        Some(e) => Err(e),
        None => stopped,
    }
}
