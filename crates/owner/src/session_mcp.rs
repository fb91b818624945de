//! A session's own MCP servers (`session.create` `mcp_servers`, as an editor hands them to
//! `drover acp`'s `session/new`).
//!
//! The ledger keeps each server's command, arguments and the names of its `env` variables
//! ([`StoredMcpServer`]). The values, often credentials, are never stored in the ledger (SPEC
//! section 9): they go to `<home>/sessions/<session_id>/mcp_env.json`, mode 0600 in a 0700
//! directory, written before the session is committed, and out of tools' reach (the home is
//! hidden from them). At each claim the two are put back together into the worker's
//! [`McpServerSpec`]s, beside the config's `[mcp_servers.<name>]` of the session's toolsets.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use drover_ledger::{SessionRow, StoredMcpServer};
use drover_protocol::client::SessionMcpServer;
use drover_protocol::worker::McpServerSpec;
use drover_protocol::Secret;

/// The `env` values of a session's servers: by server name, then variable name.
pub type EnvValues = BTreeMap<String, BTreeMap<String, Secret>>;

/// `<home>/sessions/<session_id>/mcp_env.json`.
pub fn env_path(home: &Path, session_id: &str) -> PathBuf {
    home.join("sessions").join(session_id).join("mcp_env.json")
}

/// The servers as the worker starts them (with their `env` values): for listing their tools
/// at `session.create`.
pub fn specs_of(servers: &BTreeMap<String, SessionMcpServer>) -> BTreeMap<String, McpServerSpec> {
    servers
        .iter()
        .map(|(name, s)| {
            let spec = McpServerSpec {
                command: s.command.clone(),
                args: s.args.clone(),
                env: s.env.clone(),
                tool_timeout_s: McpServerSpec::DEFAULT_TOOL_TIMEOUT_S,
            };
            (name.clone(), spec)
        })
        .collect()
}

/// What the ledger stores of `servers`, and their `env` values, kept apart.
pub fn split(
    servers: &BTreeMap<String, SessionMcpServer>,
) -> (BTreeMap<String, StoredMcpServer>, EnvValues) {
    let stored = servers
        .iter()
        .map(|(name, s)| {
            let row = StoredMcpServer {
                command: s.command.clone(),
                args: s.args.clone(),
                env_keys: s.env.keys().cloned().collect(),
                tool_timeout_s: McpServerSpec::DEFAULT_TOOL_TIMEOUT_S,
            };
            (name.clone(), row)
        })
        .collect();
    let env = servers
        .iter()
        .filter(|(_, s)| !s.env.is_empty())
        .map(|(name, s)| (name.clone(), s.env.clone()))
        .collect();
    (stored, env)
}

/// Writes `env` for `session_id` (nothing when it is empty), private to the daemon's user and
/// synced, so a session committed after it always finds its values.
pub fn write_env(home: &Path, session_id: &str, env: &EnvValues) -> std::io::Result<()> {
    if env.is_empty() {
        return Ok(());
    }
    let path = env_path(home, session_id);
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("the env file has no directory"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join("mcp_env.json.tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&serde_json::to_vec(env)?)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)
}

/// The session's own servers as its turn's worker starts them, their `env` values read back
/// from the session's env file. A value that cannot be read back (the file was removed or
/// spoilt) is left out and logged: the server starts without it, and says what it misses.
pub fn specs(home: &Path, session: &SessionRow) -> BTreeMap<String, McpServerSpec> {
    if session.mcp_servers.is_empty() {
        return BTreeMap::new();
    }
    let wants_env = session.mcp_servers.values().any(|s| !s.env_keys.is_empty());
    let mut env = if wants_env {
        read_env(home, &session.id)
    } else {
        EnvValues::new()
    };
    session
        .mcp_servers
        .iter()
        .map(|(name, s)| {
            let mut values = env.remove(name).unwrap_or_default();
            values.retain(|key, _| s.env_keys.contains(key));
            let missing: Vec<&String> = s
                .env_keys
                .iter()
                .filter(|k| !values.contains_key(*k))
                .collect();
            if !missing.is_empty() {
                tracing::error!(
                    session_id = %session.id,
                    server = %name,
                    ?missing,
                    "the MCP server's env values are missing from {}; it starts without them",
                    env_path(home, &session.id).display()
                );
            }
            let spec = McpServerSpec {
                command: s.command.clone(),
                args: s.args.clone(),
                env: values,
                tool_timeout_s: s.tool_timeout_s,
            };
            (name.clone(), spec)
        })
        .collect()
}

fn read_env(home: &Path, session_id: &str) -> EnvValues {
    let path = env_path(home, session_id);
    let read = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()));
    read.unwrap_or_else(|e| {
        tracing::error!(%session_id, error = %e, "cannot read {}", path.display());
        EnvValues::new()
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn server(env: &[(&str, &str)]) -> SessionMcpServer {
        SessionMcpServer {
            command: "/bin/srv".into(),
            args: vec!["--stdio".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), Secret::from(v.to_string())))
                .collect(),
        }
    }

    #[test]
    fn env_values_go_to_a_private_file_and_come_back_at_claim() {
        let home = tempfile::tempdir().unwrap();
        let servers = BTreeMap::from([
            ("own".to_string(), server(&[("TOKEN", "s3cret")])),
            ("plain".to_string(), server(&[])),
        ]);
        let (stored, env) = split(&servers);
        assert_eq!(stored["own"].env_keys, ["TOKEN"]);
        let ledger_text = serde_json::to_string(&stored).unwrap();
        assert!(!ledger_text.contains("s3cret"), "{ledger_text}");

        write_env(home.path(), "sid", &env).unwrap();
        let path = env_path(home.path(), "sid");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);

        let session = SessionRow {
            id: "sid".into(),
            mcp_servers: stored,
            ..SessionRow::default()
        };
        let specs = specs(home.path(), &session);
        assert_eq!(specs["own"].env["TOKEN"].expose(), "s3cret");
        assert_eq!(specs["own"].args, ["--stdio"]);
        assert!(specs["plain"].env.is_empty());

        // A lost file costs the values, not the servers.
        std::fs::remove_file(&path).unwrap();
        let specs = super::specs(home.path(), &session);
        assert!(specs["own"].env.is_empty());
        assert_eq!(specs["own"].command, "/bin/srv");
    }

    #[test]
    fn no_env_writes_no_file() {
        let home = tempfile::tempdir().unwrap();
        let (_, env) = split(&BTreeMap::from([("plain".to_string(), server(&[]))]));
        write_env(home.path(), "sid", &env).unwrap();
        assert!(!home.path().join("sessions").exists());
    }
}
