//! A LiteLLM `config.yaml` (the Proxy's, or a Router's `model_list` saved
//! as YAML) read as Hermes' catalogue: one catalogue, not two
//! (docs/integration.md#the-litellm-proxy).
//!
//! | LiteLLM | Hermes |
//! |---|---|
//! | `model_name` (the model group) | a route group |
//! | `model_info.hermes_channel`, else `model_info.id` | a channel id (what the callback reports) |
//! | `model_info.hermes_tier`, else `free` when both token costs are 0, else `paid` | `tier` |
//! | `model_info.hermes_price_per_1k_tokens`, else the mean of `input_cost_per_token` and `output_cost_per_token` × 1000 (`litellm_params`, then `model_info`) | `price_per_1k_tokens` |
//! | `model_info.hermes_capacity_rps`, else `rpm` ÷ 60 (`litellm_params`, then `model_info`) | `capacity_rps` |

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Deserialize)]
struct ConfigYaml {
    #[serde(default)]
    model_list: Vec<ModelEntry>,
}

#[derive(Debug, Deserialize)]
struct ModelEntry {
    model_name: String,
    #[serde(default)]
    litellm_params: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    model_info: BTreeMap<String, serde_norway::Value>,
}

/// One deployment as Hermes' catalogue needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub group: String,
    pub channel: String,
    pub tier: hermes::config::Tier,
    pub price_per_1k_tokens: f64,
    pub capacity_rps: f64,
}

fn number(v: Option<&serde_norway::Value>) -> Option<f64> {
    match v? {
        serde_norway::Value::Number(n) => n.as_f64(),
        serde_norway::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn text(v: Option<&serde_norway::Value>) -> Option<String> {
    match v? {
        serde_norway::Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        serde_norway::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl ModelEntry {
    /// A field of `litellm_params`, else of `model_info`.
    fn param(&self, key: &str) -> Option<f64> {
        number(self.litellm_params.get(key)).or_else(|| number(self.model_info.get(key)))
    }

    fn deployment(&self, n: usize) -> Result<Deployment, String> {
        let at = format!("model_list[{n}] ({})", self.model_name);
        let channel = text(self.model_info.get("hermes_channel"))
            .or_else(|| text(self.model_info.get("id")))
            .ok_or_else(|| {
                format!(
                    "{at}: no model_info.id: set one (LiteLLM otherwise makes up a hash, \
                     and Hermes cannot name the channel)"
                )
            })?;
        let costs = [
            self.param("input_cost_per_token"),
            self.param("output_cost_per_token"),
        ];
        let price = match number(self.model_info.get("hermes_price_per_1k_tokens")) {
            Some(p) => p,
            None => {
                let known: Vec<f64> = costs.iter().flatten().copied().collect();
                if known.is_empty() {
                    0.0
                } else {
                    known.iter().sum::<f64>() / known.len() as f64 * 1000.0
                }
            }
        };
        let tier = match text(self.model_info.get("hermes_tier")).as_deref() {
            Some("free") => hermes::config::Tier::Free,
            Some("paid") => hermes::config::Tier::Paid,
            Some(other) => {
                return Err(format!(
                    "{at}: model_info.hermes_tier `{other}`: expected free or paid"
                ))
            }
            None if price > 0.0 => hermes::config::Tier::Paid,
            None => hermes::config::Tier::Free,
        };
        let capacity_rps = number(self.model_info.get("hermes_capacity_rps"))
            .or_else(|| self.param("rpm").map(|rpm| rpm / 60.0))
            .filter(|c| *c > 0.0)
            .ok_or_else(|| {
                format!(
                    "{at}: no capacity: set litellm_params.rpm (LiteLLM's own limit) or \
                     model_info.hermes_capacity_rps"
                )
            })?;
        if !price.is_finite() || price < 0.0 {
            return Err(format!("{at}: a negative or invalid token cost"));
        }
        Ok(Deployment {
            group: self.model_name.clone(),
            channel,
            tier,
            price_per_1k_tokens: price,
            capacity_rps,
        })
    }
}

/// Every deployment of a LiteLLM config file, or every problem found in it
/// (each naming its `model_list` entry).
pub fn read(path: &Path) -> Result<Vec<Deployment>, Vec<String>> {
    let raw = std::fs::read_to_string(path).map_err(|e| vec![format!("{e}")])?;
    parse(&raw)
}

/// [`read`] of a text.
pub fn parse(raw: &str) -> Result<Vec<Deployment>, Vec<String>> {
    let cfg: ConfigYaml =
        serde_norway::from_str(raw).map_err(|e| vec![format!("not a LiteLLM config: {e}")])?;
    if cfg.model_list.is_empty() {
        return Err(vec!["model_list is empty: no deployment to route".into()]);
    }
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (n, m) in cfg.model_list.iter().enumerate() {
        match m.deployment(n) {
            Ok(d) => {
                if let Some(other) = seen.insert(d.channel.clone(), d.group.clone()) {
                    problems.push(format!(
                        "model_list[{n}]: channel `{}` appears twice (groups {other} and {}); \
                         a channel belongs to one route group",
                        d.channel, d.group
                    ));
                }
                out.push(d);
            }
            Err(e) => problems.push(e),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The `[[groups]]` catalogue for `hermes.toml`, in the order LiteLLM lists
/// the deployments.
pub fn catalogue_toml(deployments: &[Deployment]) -> String {
    let mut groups: Vec<(&str, Vec<&Deployment>)> = Vec::new();
    for d in deployments {
        match groups.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, ds)) => ds.push(d),
            None => groups.push((&d.group, vec![d])),
        }
    }
    let mut s = String::new();
    for (group, ds) in groups {
        s.push_str(&format!("[[groups]]\nid = {}\n", toml_str(group)));
        for d in ds {
            s.push_str(&format!(
                "\n[[groups.channels]]\nid = {}\ntier = \"{}\"\nprice_per_1k_tokens = {}\ncapacity_rps = {}\n",
                toml_str(&d.channel),
                d.tier.as_str(),
                d.price_per_1k_tokens,
                round3(d.capacity_rps)
            ));
        }
        s.push('\n');
    }
    s
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// What a gateway's deployments and Hermes' catalogue disagree on, one line
/// each, with what it costs.
pub fn compare(deployments: &[Deployment], cfg: &hermes::config::Config) -> Vec<String> {
    let mut out = Vec::new();
    for d in deployments {
        match cfg
            .groups
            .iter()
            .find(|g| g.channels.iter().any(|c| c.id == d.channel))
        {
            None => out.push(format!(
                "deployment `{}` of model group `{}` is not a channel in Hermes: its events \
                 are dead-lettered (unknown_channel) and it is never weighted",
                d.channel, d.group
            )),
            Some(g) if g.id != d.group => out.push(format!(
                "deployment `{}` is in model group `{}` but Hermes has it in route group `{}`: \
                 its events are dead-lettered (group_mismatch) unless HERMES_ROUTE_GROUPS maps \
                 the model group",
                d.channel, d.group, g.id
            )),
            Some(_) => {}
        }
    }
    for g in &cfg.groups {
        for c in &g.channels {
            if !deployments.iter().any(|d| d.channel == c.id) {
                out.push(format!(
                    "channel `{}` of route group `{}` is no deployment of the gateway's config: \
                     this gateway never sends it traffic",
                    c.id, g.id
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROXY: &str = r#"
model_list:
  - model_name: chat
    litellm_params:
      model: openai/free-model
      api_base: http://127.0.0.1:9001/v1
      rpm: 600
    model_info:
      id: free-a
  - model_name: chat
    litellm_params:
      model: openai/paid-model
      input_cost_per_token: 0.0000005
      output_cost_per_token: 0.0000015
      rpm: 3000
    model_info:
      id: paid-a
  - model_name: chat
    litellm_params:
      model: openai/other
    model_info:
      id: paid-b
      hermes_tier: paid
      hermes_price_per_1k_tokens: 0.6
      hermes_capacity_rps: 25
litellm_settings:
  callbacks: ["hermes_gateway.litellm.proxy_handler"]
"#;

    #[test]
    fn a_proxy_config_is_a_catalogue_hermes_reads() {
        let ds = parse(PROXY).unwrap();
        assert_eq!(ds.len(), 3);
        assert_eq!(ds[0].tier, hermes::config::Tier::Free);
        assert_eq!(ds[0].capacity_rps, 10.0);
        assert_eq!(ds[1].tier, hermes::config::Tier::Paid);
        assert!((ds[1].price_per_1k_tokens - 0.001).abs() < 1e-12);
        assert_eq!(ds[2].capacity_rps, 25.0);
        let toml = catalogue_toml(&ds);
        let cfg = hermes::config::Config::from_toml(&toml).expect("Hermes reads the catalogue");
        assert_eq!(cfg.groups.len(), 1);
        assert_eq!(cfg.groups[0].channels.len(), 3);
        assert!(compare(&ds, &cfg).is_empty());
    }

    #[test]
    fn every_problem_names_its_entry() {
        let bad = "model_list:\n  - model_name: chat\n    litellm_params: {model: x}\n  - model_name: chat\n    litellm_params: {model: y, rpm: 60}\n    model_info: {id: a, hermes_tier: gold}\n";
        let problems = parse(bad).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("model_list[0]") && problems[0].contains("model_info.id"));
        assert!(problems[1].contains("model_list[1]") && problems[1].contains("gold"));
    }

    #[test]
    fn what_the_two_catalogues_disagree_on_is_named_with_its_cost() {
        let ds = parse(PROXY).unwrap();
        let mut cfg = hermes::config::Config::from_toml(&catalogue_toml(&ds)).unwrap();
        cfg.groups[0].channels.retain(|c| c.id != "paid-b");
        cfg.groups[0].channels[0].id = "free-z".into();
        let diff = compare(&ds, &cfg);
        assert_eq!(diff.len(), 3, "{diff:?}");
        assert!(diff
            .iter()
            .any(|l| l.contains("`paid-b`") && l.contains("unknown_channel")));
        assert!(diff
            .iter()
            .any(|l| l.contains("`free-z`") && l.contains("never sends")));
    }
}
