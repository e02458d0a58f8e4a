//! `hermes status`: the fleet as Redis holds it, no instance needed.

use anyhow::{bail, Context};
use hermes::publish::{redact_url, WeightSnapshot};
use hermes::redis_keys::{snapshot_key, state_key, OVERRIDES_KEY};
use hermes::service::overrides::Overrides;
use hermes::service::state_store::SavedState;
use hermes::service::status::StatusView;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Redis URL (default: the config's `redis.url`).
    #[arg(long)]
    redis: Option<String>,
    /// Read `redis.url` from this config file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// One JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let url = match (&a.redis, &a.config) {
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
    let view = runtime.block_on(from_redis(&url))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", view.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// The group of a `hermes:{GROUP}:…` key.
fn group_of(key: &str) -> Option<&str> {
    key.strip_prefix("hermes:{")?
        .split_once("}:")
        .map(|(g, _)| g)
}

/// The fleet as Redis holds it: every group with a snapshot or saved state
/// machines, every channel in them, and the overrides. Needs no instance.
async fn from_redis(url: &str) -> anyhow::Result<StatusView> {
    let client = redis::Client::open(url)
        .map_err(|e| anyhow::anyhow!("bad redis url {}: {e}", redact_url(url)))?;
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(3)));
    let mut c = client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .map_err(|e| anyhow::anyhow!("redis {}: {e}", redact_url(url)))?;
    let mut groups = BTreeSet::new();
    for pattern in ["hermes:{*}:weights", "hermes:{*}:state"] {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await?;
            groups.extend(keys.iter().filter_map(|k| group_of(k)).map(str::to_string));
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    let mut view = StatusView {
        source: format!("hermes status: redis {}", redact_url(url)),
        generated_ms: hermes::wall_clock::now_ms(),
        ..Default::default()
    };
    for group in groups {
        let raw: Option<String> = redis::cmd("GET")
            .arg(snapshot_key(&group))
            .query_async(&mut c)
            .await?;
        let snap = raw.and_then(|r| serde_json::from_str::<WeightSnapshot>(&r).ok());
        let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(state_key(&group))
            .query_async(&mut c)
            .await?;
        let machines = fields
            .into_iter()
            .filter_map(|(ch, json)| {
                serde_json::from_str::<SavedState>(&json)
                    .ok()
                    .map(|s| (ch, s))
            })
            .collect();
        view.add_group(&group, snap, machines);
    }
    let overrides: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(OVERRIDES_KEY)
        .query_async(&mut c)
        .await?;
    Ok(view.with_overrides(&Overrides::from_fields(overrides)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_group() {
        assert_eq!(group_of("hermes:{chat}:weights"), Some("chat"));
        assert_eq!(group_of("hermes:{a:b}:state"), Some("a:b"));
        assert_eq!(group_of("other"), None);
    }
}
