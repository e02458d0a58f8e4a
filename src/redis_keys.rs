//! The Redis layout, in one place: every key Hermes reads or writes and
//! every script that writes them. One group's keys share the hash tag
//! `{GROUP}`, so in Redis Cluster they live in one slot and a script may
//! touch them together.
//!
//! | key | type | written by |
//! |---|---|---|
//! | `hermes:{GROUP}:weights` | string (snapshot JSON) | [`FENCED_WRITE_LUA`] |
//! | `hermes:{GROUP}:epoch` | integer | [`TAKE_EPOCH_LUA`] |
//! | `hermes:{GROUP}:changed` | pub/sub channel | [`FENCED_WRITE_LUA`] |
//! | `hermes:{GROUP}:state` | hash (channel → saved machine) | [`KEEP_NEWEST_LUA`] |
//! | `hermes:dataset` | string (the instance that marked it, and when) | `SET NX` by every instance's state store |
//! | `hermes:overrides` | hash (`channel:ID` / `group:ID` → operator override JSON) | `HSET`/`HDEL` by the control API |

/// The Redis key holding a group's snapshot.
pub fn snapshot_key(group: &str) -> String {
    format!("hermes:{{{group}}}:weights")
}

/// The writer-epoch counter of a group (a new writer `INCR`s it).
pub fn epoch_key(group: &str) -> String {
    format!("hermes:{{{group}}}:epoch")
}

/// The channel a new version is announced on.
pub fn changed_channel(group: &str) -> String {
    format!("hermes:{{{group}}}:changed")
}

/// The durable state machines of a group's channels (`service::state_store`).
pub fn state_key(group: &str) -> String {
    format!("hermes:{{{group}}}:state")
}

/// The group of a `hermes:{GROUP}:…` key (`None` for any other key).
pub fn group_of_key(key: &str) -> Option<&str> {
    key.strip_prefix("hermes:{")?
        .split_once("}:")
        .map(|(g, _)| g)
}

/// The `SCAN MATCH` patterns of every group's snapshot and saved state.
pub const GROUP_KEY_PATTERNS: [&str; 2] = ["hermes:{*}:weights", "hermes:{*}:state"];

/// Marks a Redis dataset that holds Hermes' saved state. Its absence means
/// Redis lost its data (restarted empty, flushed): every instance then
/// saves all of its channels' state again (`service::state_store`).
pub const DATASET_KEY: &str = "hermes:dataset";

/// The operator overrides (pins and freezes) of the whole fleet: one hash,
/// read by every instance (`service::overrides`).
pub const OVERRIDES_KEY: &str = "hermes:overrides";

/// The fenced write. `KEYS[1]`: the snapshot key; `KEYS[2]`: the group's epoch
/// key. ARGV: epoch, version, heartbeat_ms, snapshot JSON, change channel.
/// Returns `{outcome, stored_epoch, stored_version}` with outcome one of
/// `written` (new version stored and announced), `heartbeat` (same version,
/// newer heartbeat stored), `unchanged`, `stale` (refused: older than what
/// is stored, or than the epoch a newer writer has taken, even before that
/// writer publishes anything). A Redis that came back empty gets the
/// writer's epoch back with its next write, so a writer older than
/// it is fenced again from then on.
pub const FENCED_WRITE_LUA: &str = r#"
local epoch = tonumber(ARGV[1])
local version = tonumber(ARGV[2])
local heartbeat = tonumber(ARGV[3])
local taken = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if epoch < taken then
  return {'stale', taken, 0}
end
local current = redis.call('GET', KEYS[1])
if current then
  local ok, doc = pcall(cjson.decode, current)
  if ok and type(doc) == 'table' then
    local e = tonumber(doc['epoch']) or 0
    local v = tonumber(doc['version']) or 0
    if epoch < e or (epoch == e and version < v) then
      return {'stale', e, v}
    end
    if epoch == e and version == v then
      local h = tonumber(doc['heartbeat_ms']) or 0
      if heartbeat > h then
        if epoch > taken then
          redis.call('SET', KEYS[2], epoch)
        end
        redis.call('SET', KEYS[1], ARGV[4])
        return {'heartbeat', e, v}
      end
      return {'unchanged', e, v}
    end
  end
end
if epoch > taken then
  redis.call('SET', KEYS[2], epoch)
end
redis.call('SET', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[2])
return {'written', epoch, version}
"#;

/// Takes the next writer epoch of a group. `KEYS[1]`: the epoch key; `KEYS[2]`:
/// the snapshot key. `ARGV[1]`: the writer's wall clock in ms. Returns
/// `{epoch, stored snapshot or false}`.
///
/// The epoch must never go backwards, or gateways that saw a higher one
/// would refuse every later snapshot. `INCR` alone restarts at 1 when Redis
/// comes back empty, so the first epoch of a key that does not exist is the
/// wall clock in ms (later than every epoch of an earlier dataset, which
/// grew by one per takeover from its own first wall-clock epoch), and an
/// epoch is never at or below the stored snapshot's.
pub const TAKE_EPOCH_LUA: &str = r#"
local epoch
if redis.call('EXISTS', KEYS[1]) == 1 then
  epoch = redis.call('INCR', KEYS[1])
else
  epoch = tonumber(ARGV[1])
end
local stored = redis.call('GET', KEYS[2])
if stored then
  local ok, doc = pcall(cjson.decode, stored)
  if ok and type(doc) == 'table' then
    local e = tonumber(doc['epoch']) or 0
    if epoch <= e then
      epoch = e + 1
    end
  end
end
redis.call('SET', KEYS[1], epoch)
return {epoch, stored or false}
"#;

/// Keeps the newest saved state machine of a channel. `KEYS[1]`: the group's
/// state hash; ARGV: channel, saved_at_ms, JSON. A write older (by event
/// time) than the stored one is refused (returns 0).
pub const KEEP_NEWEST_LUA: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and type(doc) == 'table' and tonumber(doc['saved_at_ms']) and tonumber(doc['saved_at_ms']) > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_group() {
        assert_eq!(group_of_key(&snapshot_key("chat")), Some("chat"));
        assert_eq!(group_of_key("hermes:{a:b}:state"), Some("a:b"));
        assert_eq!(group_of_key("other"), None);
    }
}
