//! Hermes keeps a fleet of LLM gateways routing around sick upstreams.
//!
//! Gateways emit one Avro event per upstream attempt; Hermes turns those
//! events into per-channel health, runs a graded state machine and a
//! cost-aware scheduler per route group, and publishes weights that gateways
//! read atomically. Every action is also an alert event.
//!
//! # Layout
//! The **engine** is pure, synchronous and deterministic: it imports no
//! tokio, Kafka or Redis, and every time-dependent call takes event time.
//!
//! - `event`: the request event (`schemas/request_event.avsc`), borrowed.
//! - `codec`: Avro decode (plain and Confluent framing, writer-schema
//!   resolution) and encode; typed errors for the dead-letter topic.
//! - `config`: the TOML config, every threshold as a validated default,
//!   tier and per-channel overrides.
//! - `digest`: a view's merged t-digest, built from ordered runs.
//! - `window`: event-time slice rings with t-digests, the last-N outcome
//!   window, the failure streak, the baseline.
//! - `signals`: docs/decisions.md#signals signals measured from the windows.
//! - `score`: the weighted health score with its breakdown.
//! - `state`: the HEALTHY / AT_RISK / DRAINED / OBSERVING / RECOVERING
//!   machine, pins, oscillation detection.
//! - `alert`: alert events, severities and dedup.
//! - `engine`: ties the above together per event and per evaluation tick,
//!   for the channels of one partition.
//! - `health`: the health model: a channel's health, a partition's report.
//! - `board`: the newest report of every channel of a group; which request
//!   partition writes which group.
//! - `safety`: group-level safety (docs/decisions.md#safety-rails): a correlated failure across
//!   a route group puts it in panic mode instead of draining it.
//! - `schedule`: the cost-aware graded scheduler: per route group and
//!   traffic class, weights over channels, shed shares, projected spend.
//!
//! - `composition`: engines → health reports → board → scheduler →
//!   snapshot, the chain the service runs; in one process for the simulator
//!   and replay.
//! - `routing`: a snapshot as alias tables, O(1) weighted picks.
//! - `redis_keys`: every Redis key and the scripts that write them.
//! - `replay`: recorded events through another config (what-if).
//! - `sim`: the closed-loop fault simulator and drill report; it drives the
//!   same engine the service runs.
//! - `dedup`: duplicate event ids within an event-time horizon.
//! - `prefetch`: cache hints for the records a batch holds ahead of the one
//!   being applied (changes speed only).
//! - `present`: what people read, in one style: the command line's
//!   tables, signals as a phrase, the HTML page of the drill timeline and
//!   the channel report.
//!
//! The **shell** translates between the world and engine calls:
//! - `publish`: the weight snapshot format and fencing rule
//!   (pure), and `publish::redis`, the fenced Lua write with retries.
//! - `client`: the gateway-side reader: the snapshot from Redis, kept fresh.
//! - `wall_clock`: the shell's one wall clock.
//! - `backoff`: the retry delay every adapter's retry loop uses.
//! - `service`: `hermes run`: the request loop (one engine per owned
//!   partition, restore and replay, dead letters, alerts, health reports),
//!   the group writers, the state store, the registry client, metrics.
//! - `demo`: the service on the in-process Kafka mock cluster with
//!   simulated gateways.
//! - `bench`: `hermes bench`, the request path at steady state (decode,
//!   dedup, engine, outputs) with windows full, for capacity planning.
//! - `channel_report`: `hermes report`, the weekly channel report from
//!   the alert stream (Markdown and a self-contained HTML page).
//! - `allocator`: jemalloc as the process's allocator, its memory in huge
//!   pages (speed only).
//! - `main.rs` and `src/cli/`: the command line (a binary-only module
//!   tree, one file per command with its arguments and its `run`; the
//!   control API's client is there too).
//!
//! # The public face
//! What a gateway or an embedding program uses is public: events and the
//! codec, config, the engine and its composition, the weight snapshot, the
//! client and routing, and the service's `run` and its control vocabulary
//! (`service::overrides`, `service::state_store`, `service::status`). The
//! engine's inner rooms (digests, dedup, clocks, the allocator, hints) are
//! crate-private, and so are the service's loops. The command line's own
//! tools (`demo`, `sim`, `replay`, `channel_report`, `bench`) are behind
//! the default `cli` feature: `default-features = false` leaves them out.

pub mod alert;
pub(crate) mod allocator;
pub(crate) mod backoff;
#[cfg(feature = "cli")]
pub mod bench;
pub mod board;
#[cfg(feature = "cli")]
pub mod channel_report;
pub mod client;
pub(crate) mod clock;
pub mod codec;
pub mod composition;
pub mod config;
pub(crate) mod dedup;
#[cfg(feature = "cli")]
pub mod demo;
pub(crate) mod digest;
pub mod engine;
pub mod event;
pub mod health;
pub(crate) mod id_table;
pub(crate) mod prefetch;
pub mod present;
pub mod publish;
pub mod redis_keys;
#[cfg(feature = "cli")]
pub mod replay;
pub mod routing;
pub(crate) mod safety;
pub mod schedule;
pub(crate) mod score;
pub mod service;
pub(crate) mod short_str;
pub mod signals;
#[cfg(feature = "cli")]
pub mod sim;
pub mod state;
pub mod wall_clock;
pub(crate) mod window;
