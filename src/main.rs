//! The `hermes` command line: the imperative shell around the engine.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use hermes::config::Config;
use hermes::sim::scenario::Scenario;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "hermes",
    version,
    about = "Keeps LLM gateways routing around sick upstreams"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum CtlAction {
    /// Pin a channel: drain it, hold a weight, or force it healthy.
    #[command(group(
        clap::ArgGroup::new("how")
            .required(true)
            .args(["drain", "weight", "healthy"])
    ))]
    Pin {
        channel: String,
        /// Weight 0 whatever its health.
        #[arg(long)]
        drain: bool,
        /// Hold this health weight factor (0..1).
        #[arg(long, allow_negative_numbers = true)]
        weight: Option<f64>,
        /// Full weight whatever its health.
        #[arg(long)]
        healthy: bool,
        /// Lapse after this long (90s, 30m, 2h, 1d; a unit is required);
        /// default: until cleared.
        #[arg(long = "for", value_parser = duration_s)]
        for_: Option<u64>,
        /// Why (goes into the OVERRIDE alert).
        #[arg(long)]
        reason: String,
    },
    /// Release a channel's pin.
    Unpin {
        channel: String,
        #[arg(long)]
        reason: String,
    },
    /// Freeze a group's weights as published (manual mode).
    Freeze {
        group: String,
        /// Lapse after this long (90s, 30m, 2h, 1d); default: until cleared.
        #[arg(long = "for", value_parser = duration_s)]
        for_: Option<u64>,
        #[arg(long)]
        reason: String,
    },
    /// Give a frozen group back to Hermes.
    Unfreeze {
        group: String,
        #[arg(long)]
        reason: String,
    },
    /// The overrides in force and recent clears.
    List {
        /// The stored JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: consume request events from Kafka, publish weights
    /// to Redis and alerts to Kafka (brokers, topics and Redis come from the
    /// config; see hermes.example.toml). The config is reloaded on change.
    Run {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Log lines as text for people, or one JSON object per line for a
        /// log pipeline. Colours only when stderr is a terminal.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// The fleet as Redis holds it, no instance needed: per group the
    /// writer epoch, snapshot version and age; per channel the state, score
    /// and its top signals, weights per class and any operator pin.
    Status {
        /// Redis URL (default: the config's `redis.url`).
        #[arg(long)]
        redis: Option<String>,
        /// Read `redis.url` from this config file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// One JSON object instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// The channel report (incident 003's weekly review) from the alert stream:
    /// per channel availability, incidents (time to drain, time drained,
    /// time to recover, worst signals), time in each state and overrides;
    /// written as PREFIX.md and a self-contained PREFIX.html.
    Report {
        /// Alerts as JSON lines (`hermes simulate --alerts`); otherwise the
        /// alert topic is read.
        #[arg(long)]
        alerts: Option<PathBuf>,
        /// The config: its channels are all reported (quiet ones too), and
        /// without --alerts its `[kafka]` section says where the alerts are.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Brokers to read the alert topic from (instead of a config).
        #[arg(long)]
        bootstrap: Option<String>,
        /// The alert topic (default: the config's, else hermes.alerts).
        #[arg(long)]
        topic: Option<String>,
        /// Start of the period: 2026-11-24, 2026-11-24T08:00:00Z or epoch ms
        /// (default: 7 days before --to).
        #[arg(long)]
        from: Option<String>,
        /// End of the period (default: now).
        #[arg(long)]
        to: Option<String>,
        /// Output path prefix: PREFIX.md and PREFIX.html.
        #[arg(long, default_value = "hermes-report")]
        out: PathBuf,
    },
    /// Steer Hermes through an instance's control API: pin a channel,
    /// freeze a group, clear, list. Every change is stored in Redis (it
    /// survives restarts and takeovers), reaches whichever instance owns the
    /// channel or writes the group, and is recorded as an OVERRIDE alert
    /// naming the actor and the reason.
    Ctl {
        /// An instance's HTTP endpoint (its `service.http_listen`).
        #[arg(
            long,
            global = true,
            default_value = "http://127.0.0.1:9464",
            env = "HERMES_URL"
        )]
        url: String,
        /// The control token (`service.control_token`).
        #[arg(
            long,
            global = true,
            env = "HERMES_CONTROL_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
        /// A file holding the control token (its first line), so the token
        /// is neither on the command line nor in the environment.
        #[arg(long, global = true, conflicts_with = "token")]
        token_file: Option<PathBuf>,
        /// Who is asking (goes into the OVERRIDE alert; default: $USER).
        #[arg(long, global = true)]
        actor: Option<String>,
        #[command(subcommand)]
        action: CtlAction,
    },
    /// Validate a config file as `hermes run` would; every problem is
    /// listed with the key at fault.
    CheckConfig {
        /// The TOML config file.
        file: PathBuf,
        /// Only what the engine needs (a config for `simulate` or `replay`):
        /// skip the checks only `hermes run` makes (brokers, Redis URL).
        #[arg(long)]
        engine_only: bool,
    },
    /// Run the whole loop on this machine with nothing installed: an
    /// in-process Kafka mock cluster, simulated gateways producing Avro
    /// events (a fault after a minute), the engine and scheduler consuming
    /// them, weights published in process (or to Redis), a live status table.
    Demo {
        /// Wall-clock seconds to run.
        #[arg(long, default_value_t = 180)]
        seconds: u64,
        /// Publish weights to this Redis (e.g. redis://127.0.0.1:6379/) and
        /// have the gateways read them from there.
        #[arg(long)]
        redis: Option<String>,
        /// Another scenario for the gateways and channels (default:
        /// scenarios/demo.toml, built in).
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// Append status tables instead of redrawing the screen.
        #[arg(long)]
        plain: bool,
        /// Also serve Prometheus `/metrics` and `/status` on this address
        /// (e.g. 127.0.0.1:9464).
        #[arg(long)]
        http: Option<String>,
    },
    /// The demo's simulated gateways against a real cluster and Redis: the
    /// scenario's traffic as Avro events to the request topic, routed by
    /// the weights Hermes publishes (a traffic source for the compose
    /// stack, or for trying a config against a real broker).
    Gateways {
        /// Kafka bootstrap servers.
        #[arg(long)]
        bootstrap: String,
        /// Redis holding the weights (Hermes' `redis.url`).
        #[arg(long)]
        redis: String,
        /// The scenario: channels, traffic, faults (at their times from the
        /// start). Its group and channels must be in Hermes' config.
        #[arg(long)]
        scenario: PathBuf,
        #[arg(long, default_value = "hermes.requests")]
        topic: String,
        /// Wall-clock seconds to run; 0: until interrupted.
        #[arg(long, default_value_t = 0)]
        seconds: u64,
    },
    /// Replay a fault scenario on a simulated clock through the engine and
    /// scheduler, closed loop, and report time to detect / drain / recover,
    /// flaps, false drains, harm and cost.
    Simulate {
        /// The scenario file (see scenarios/).
        scenario: PathBuf,
        /// Use this config's thresholds (its `groups` are replaced by the
        /// scenario's channels) instead of the scenario's `[config]`.
        #[arg(long)]
        config: Option<PathBuf>,
        /// RNG seed (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Write a self-contained HTML timeline of weight, state and score.
        #[arg(long)]
        timeline: Option<PathBuf>,
        /// Record every request event of the Hermes run (Avro container file).
        #[arg(long)]
        record: Option<PathBuf>,
        /// Write the effective Hermes config (for `hermes replay`).
        #[arg(long)]
        write_config: Option<PathBuf>,
        /// Write every alert of the Hermes run as JSON lines.
        #[arg(long)]
        alerts: Option<PathBuf>,
    },
    /// Run recorded request events (Avro container file) through a config and
    /// report the decisions it would have made.
    Replay {
        /// Events written by `hermes simulate --record` (or any Avro container
        /// file of request events).
        events: PathBuf,
        /// The config to try.
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Measure the request path (decode, dedup, engine, outputs) at steady
    /// state on one thread, for capacity planning: the windows are filled
    /// first (the long window of event time, not timed), then `--seconds`
    /// of event time are measured. Prints events/s, decode-only events/s,
    /// resident bytes per channel and the longest pause (wall and CPU time).
    Bench {
        /// Channels (in route groups of ten).
        #[arg(long, default_value_t = 1000)]
        channels: usize,
        /// Mean events per second per channel.
        #[arg(long, default_value_t = 20.0)]
        rate: f64,
        /// Event-time seconds measured after the warm-up.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Event-time seconds of warm-up (default: the long window).
        #[arg(long)]
        warmup: Option<u64>,
        /// Skewed traffic (Zipf: the busiest 1 % of channels carry about
        /// half) instead of the same rate everywhere.
        #[arg(long)]
        skewed: bool,
        /// Gateways sending the traffic, each event from one at random.
        #[arg(long, default_value_t = 1)]
        gateways: usize,
        /// How far apart the gateways' clocks are (ms), spread evenly:
        /// a channel's events arrive out of event-time order by up to this
        /// much, as they do from a real fleet (e.g. `--gateways 8
        /// --clock-spread-ms 3500`). Needs two gateways or more.
        #[arg(long, default_value_t = 0)]
        clock_spread_ms: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Use this config's policy (`[engine]` and the rest; its groups
        /// are replaced by the generated ones) instead of the defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Split the channels over this many partitions and compare one
        /// thread with `--threads` (each thread owning its partitions, as
        /// request loops do).
        #[arg(long)]
        partitions: Option<usize>,
        /// Threads for `--partitions` (default: one per core).
        #[arg(long, requires = "partitions")]
        threads: Option<usize>,
    },
}

fn check_config(file: &Path, engine_only: bool) -> anyhow::Result<ExitCode> {
    let checked = hermes::config::ConfigFile::from_file(file)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            if !engine_only {
                hermes::service::check_runnable(&f.runtime).map_err(|e| {
                    format!("{e} (--engine-only skips the checks only `hermes run` makes)")
                })?;
            }
            Ok(f)
        });
    match checked {
        Ok(parsed) => {
            for w in &parsed.warnings {
                eprintln!("{}: warning: {w}", file.display());
            }
            let cfg = parsed.policy;
            let channels = cfg.channels().count();
            println!(
                "{}: ok ({} route groups, {} channels)",
                file.display(),
                cfg.groups.len(),
                channels
            );
            for g in &cfg.groups {
                for c in &g.channels {
                    println!(
                        "  {:<12} {:<16} tier={:<4} price/1k={:<8} capacity_rps={:<8} initial_weight={}",
                        g.id,
                        c.id,
                        c.tier.as_str(),
                        c.price_per_1k_tokens,
                        c.capacity_rps,
                        c.initial_weight
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            Ok(ExitCode::from(2))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn simulate(
    scenario: &Path,
    config: Option<&Path>,
    seed: Option<u64>,
    json: bool,
    timeline: Option<&Path>,
    record: Option<&Path>,
    write_config: Option<&Path>,
    alerts: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(scenario)
        .with_context(|| format!("reading {}", scenario.display()))?;
    let sc = Scenario::from_toml(&text)
        .map_err(|e| bad_input(format!("{}: {e}", scenario.display())))?;
    let user_text = match config {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let overrides = match (&user_text, config) {
        (Some(t), Some(p)) => Some(
            t.parse::<toml::Table>()
                .map_err(|e| bad_input(format!("{}: not valid TOML: {e}", p.display())))?,
        ),
        _ => None,
    };
    let cfg_text = sc
        .hermes_config_text(overrides.as_ref())
        .map_err(bad_input)?;
    // Problems are reported against the file the user wrote: the --config
    // file, or the scenario's own [config] table.
    let cfg = Config::from_toml(&cfg_text).map_err(|e| match (config, &user_text) {
        (Some(p), Some(t)) => anyhow::Error::new(e.relocated(t, "")).context(format!(
            "{} over {}'s channels",
            p.display(),
            scenario.display()
        )),
        _ => anyhow::Error::new(e.relocated(&text, "config."))
            .context(format!("{}'s [config]", scenario.display())),
    })?;
    if let Some(p) = write_config {
        std::fs::write(p, &cfg_text).with_context(|| format!("writing {}", p.display()))?;
    }
    let seed = seed.unwrap_or(sc.seed);
    let mut recorded = Vec::new();
    let started = std::time::Instant::now();
    let (report, run) = hermes::sim::drill(&sc, Arc::new(cfg), seed, record.map(|_| &mut recorded));
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "simulation finished"
    );
    if let Some(p) = record {
        let file = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        hermes::replay::write_events(std::io::BufWriter::new(file), &recorded)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = alerts {
        let mut lines = String::new();
        for a in &run.alerts {
            lines.push_str(&serde_json::to_string(a)?);
            lines.push('\n');
        }
        std::fs::write(p, lines).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = timeline {
        std::fs::write(p, hermes::sim::report::timeline_html(&sc, &run, &report))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", hermes::sim::report::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn replay(events: &Path, config: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let cfg = match Config::from_file(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", config.display());
            return Ok(ExitCode::from(2));
        }
    };
    let bytes = std::fs::read(events).with_context(|| format!("reading {}", events.display()))?;
    let report = hermes::replay::replay(&bytes, Arc::new(cfg)).map_err(anyhow::Error::msg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", hermes::replay::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn demo(
    seconds: u64,
    redis: Option<String>,
    scenario: Option<&Path>,
    plain: bool,
    http: Option<String>,
) -> anyhow::Result<ExitCode> {
    let text = match scenario {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => include_str!("../scenarios/demo.toml").to_string(),
    };
    let sc = Scenario::from_toml(&text).map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    use std::io::IsTerminal;
    let summary = runtime.block_on(hermes::demo::run(hermes::demo::DemoOptions {
        scenario: sc,
        seconds,
        redis_url: redis,
        redraw: !plain && std::io::stdout().is_terminal(),
        show_status: true,
        garbage_every: 500,
        http_listen: http,
        http_bound: None,
        commands: Vec::new(),
        config_path: None,
    }))?;
    println!(
        "\ndemo finished: {} events produced ({} garbage records), {} consumed, {} applied, {} dead-lettered, {} alerts produced, weight versions {:?}\nfinal states: {:?}",
        summary.produced,
        summary.garbage_sent,
        summary.consumed,
        summary.applied,
        summary.dead_lettered,
        summary.alerts_produced,
        summary.snapshot_versions,
        summary.final_states
    );
    Ok(ExitCode::SUCCESS)
}

fn run(config: &Path) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(hermes::service::run(config))?;
    Ok(ExitCode::SUCCESS)
}

fn status(redis: Option<&str>, config: Option<&Path>, json: bool) -> anyhow::Result<ExitCode> {
    let url = match (redis, config) {
        (Some(u), _) => u.to_string(),
        (None, Some(p)) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let file = hermes::config::ConfigFile::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            file.runtime.redis.url.clone()
        }
        (None, None) => bail!("say where the fleet is: --redis URL or --config FILE"),
    };
    if url.is_empty() {
        bail!("the config has no redis.url; pass --redis URL");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let view = runtime.block_on(hermes::service::status::from_redis(&url))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", view.render());
    }
    Ok(ExitCode::SUCCESS)
}

fn ctl(
    url: &str,
    token: Option<String>,
    actor: Option<String>,
    action: &CtlAction,
) -> anyhow::Result<ExitCode> {
    use hermes::ctl::{render_list, Client};
    use hermes::service::overrides::Action;
    let actor = actor
        .or_else(|| std::env::var("USER").ok())
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let client = Client::new(url, token.filter(|t| !t.is_empty()), actor);
    let answer = match action {
        CtlAction::Pin {
            channel,
            drain,
            weight,
            healthy,
            for_,
            reason,
        } => {
            if let Some(w) = weight.filter(|w| !(0.0..=1.0).contains(w)) {
                return Err(bad_input(format!(
                    "--weight {w}: a health weight factor is within 0..1"
                )));
            }
            let action = match (drain, weight, healthy) {
                (true, _, _) => Action::Drain,
                (_, Some(w), _) => Action::Weight { weight: *w },
                (_, _, true) => Action::Healthy,
                _ => bail!("say how: --drain, --weight W or --healthy"),
            };
            client.set("channels", channel, action, reason, *for_)?
        }
        CtlAction::Unpin { channel, reason } => client.clear("channels", channel, reason)?,
        CtlAction::Freeze {
            group,
            for_,
            reason,
        } => client.set("groups", group, Action::Freeze, reason, *for_)?,
        CtlAction::Unfreeze { group, reason } => client.clear("groups", group, reason)?,
        CtlAction::List { json } => {
            let v = client.list()?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_list(&v));
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    println!("{}", serde_json::to_string(&answer)?);
    Ok(ExitCode::SUCCESS)
}

struct ReportArgs<'a> {
    alerts: Option<&'a Path>,
    config: Option<&'a Path>,
    bootstrap: Option<&'a str>,
    topic: Option<&'a str>,
    from: Option<&'a str>,
    to: Option<&'a str>,
    out: &'a Path,
}

fn report(a: ReportArgs<'_>) -> anyhow::Result<ExitCode> {
    use hermes::channel_report::{build, read_json_lines};
    use hermes::wall_clock::parse_utc_ms;
    let to = match a.to {
        Some(t) => parse_utc_ms(t).map_err(bad_input)?,
        None => hermes::wall_clock::now_ms(),
    };
    let from = match a.from {
        Some(t) => parse_utc_ms(t).map_err(bad_input)?,
        None => to - 7 * 86_400_000,
    };
    if from >= to {
        bail!("--from must be before --to");
    }
    let file = a
        .config
        .map(|p| hermes::config::ConfigFile::from_file(p).map_err(|e| anyhow::anyhow!("{e}")))
        .transpose()?;
    let catalogue: Vec<(String, String)> = file
        .iter()
        .flat_map(|f| f.policy.groups.iter())
        .flat_map(|g| g.channels.iter().map(move |c| (c.id.clone(), g.id.clone())))
        .collect();
    let alerts = match (a.alerts, &file, a.bootstrap) {
        (Some(p), _, _) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            read_json_lines(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        (None, file, bootstrap) => {
            let mut kafka = match file {
                Some(f) => f.runtime.kafka.clone(),
                None => hermes::config::KafkaConfig::default(),
            };
            if let Some(b) = bootstrap {
                kafka.brokers = b.to_string();
            }
            if kafka.brokers.is_empty() {
                bail!(
                    "say where the alerts are: --alerts FILE, --config FILE or --bootstrap BROKERS"
                );
            }
            let topic = a.topic.map_or(kafka.alert_topic.clone(), str::to_string);
            let (alerts, bad) =
                hermes::service::kafka::read_alerts(&kafka, &topic, Duration::from_secs(60))?;
            if bad > 0 {
                eprintln!("{bad} records on {topic} did not decode as alerts; left out");
            }
            alerts
        }
    };
    let r = build(&alerts, from, to, &catalogue);
    let md = a.out.with_extension("md");
    let html = a.out.with_extension("html");
    std::fs::write(&md, r.markdown()).with_context(|| format!("writing {}", md.display()))?;
    std::fs::write(&html, r.html()).with_context(|| format!("writing {}", html.display()))?;
    println!(
        "{} alerts, {} channels: wrote {} and {}",
        alerts.len(),
        r.channels.len(),
        md.display(),
        html.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Logs to stderr: text (colours only on a terminal) or JSON lines.
fn init_logs(default_level: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// Input a person must fix (a scenario file, a date, an argument): exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadInput(String);

fn bad_input(msg: impl Into<String>) -> anyhow::Error {
    BadInput(msg.into()).into()
}

/// One exit-code convention for every command: 0 done, 2 for a usage or
/// input error (arguments, which clap reports with 2 as well; a config,
/// scenario or date that does not hold), 1 for a failure while running (a
/// dependency down, a file that cannot be written).
fn exit_code(e: &anyhow::Error) -> ExitCode {
    let input = e.chain().any(|c| {
        c.is::<BadInput>()
            || c.is::<hermes::config::ConfigError>()
            || matches!(
                c.downcast_ref::<hermes::ctl::CtlError>(),
                Some(hermes::ctl::CtlError::Usage(_))
            )
    });
    ExitCode::from(if input { 2 } else { 1 })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The service logs its decisions; the interactive commands only warnings.
    let (default_level, format) = match cli.command {
        Command::Run { log_format, .. } => ("info", log_format),
        Command::Gateways { .. } => ("info", LogFormat::Text),
        _ => ("warn", LogFormat::Text),
    };
    init_logs(default_level, format);
    match dispatch(&cli) {
        Ok(code) => code,
        Err(e) => {
            // The error and its causes, each said once (an HTTP error names
            // its URL again in every layer).
            let mut said = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !said.contains(&c) {
                    said.push_str(": ");
                    said.push_str(&c);
                }
            }
            eprintln!("error: {said}");
            exit_code(&e)
        }
    }
}

fn dispatch(cli: &Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Run { config, .. } => run(config),
        Command::Status {
            redis,
            config,
            json,
        } => status(redis.as_deref(), config.as_deref(), *json),
        Command::Ctl {
            url,
            token,
            token_file,
            actor,
            action,
        } => {
            let token = match token_file {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .map_err(|e| bad_input(format!("--token-file {}: {e}", p.display())))?
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_string(),
                ),
                None => token.clone(),
            };
            ctl(url, token, actor.clone(), action)
        }
        Command::Gateways {
            bootstrap,
            redis,
            scenario,
            topic,
            seconds,
        } => {
            let text = std::fs::read_to_string(scenario)
                .with_context(|| format!("reading {}", scenario.display()))?;
            let sc = Scenario::from_toml(&text)
                .map_err(|e| bad_input(format!("{}: {e}", scenario.display())))?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let sent =
                runtime.block_on(hermes::demo::run_gateways(hermes::demo::GatewaysOptions {
                    scenario: sc,
                    bootstrap: bootstrap.clone(),
                    topic: topic.clone(),
                    redis_url: redis.clone(),
                    seconds: *seconds,
                }))?;
            println!("{sent} events produced");
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            alerts,
            config,
            bootstrap,
            topic,
            from,
            to,
            out,
        } => report(ReportArgs {
            alerts: alerts.as_deref(),
            config: config.as_deref(),
            bootstrap: bootstrap.as_deref(),
            topic: topic.as_deref(),
            from: from.as_deref(),
            to: to.as_deref(),
            out,
        }),
        Command::CheckConfig { file, engine_only } => check_config(file, *engine_only),
        Command::Demo {
            seconds,
            redis,
            scenario,
            plain,
            http,
        } => demo(
            *seconds,
            redis.clone(),
            scenario.as_deref(),
            *plain,
            http.clone(),
        ),
        Command::Simulate {
            scenario,
            config,
            seed,
            json,
            timeline,
            record,
            write_config,
            alerts,
        } => simulate(
            scenario,
            config.as_deref(),
            *seed,
            *json,
            timeline.as_deref(),
            record.as_deref(),
            write_config.as_deref(),
            alerts.as_deref(),
        ),
        Command::Replay {
            events,
            config,
            json,
        } => replay(events, config, *json),
        Command::Bench {
            channels,
            rate,
            seconds,
            warmup,
            skewed,
            gateways,
            clock_spread_ms,
            seed,
            config,
            json,
            partitions,
            threads,
        } => {
            let base_config = match config {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .with_context(|| format!("reading {}", p.display()))?,
                ),
                None => None,
            };
            let opts = hermes::bench::BenchOptions {
                base_config,
                channels: *channels,
                rate: *rate,
                seconds: *seconds,
                warmup_seconds: *warmup,
                mix: if *skewed {
                    hermes::bench::Mix::Skewed
                } else {
                    hermes::bench::Mix::Uniform
                },
                gateways: *gateways,
                clock_spread_ms: *clock_spread_ms,
                seed: *seed,
            };
            if let Some(partitions) = partitions {
                let threads = threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
                let report = hermes::bench::scaling(&opts, *partitions, threads)?;
                if *json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    println!("{}", report.table());
                }
                return Ok(ExitCode::SUCCESS);
            }
            let report = hermes::bench::run(&opts)?;
            if *json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("{}\n{}", hermes::bench::BenchReport::HEADER, report.line());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--for` as clap reads it: a duration with its unit, in seconds.
fn duration_s(text: &str) -> Result<u64, String> {
    hermes::ctl::parse_duration_s(text).map_err(|e| e.to_string())
}
