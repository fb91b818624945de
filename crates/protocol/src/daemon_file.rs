//! `<home>/daemon.json` (SPEC section 1): how a client on this host finds and authenticates
//! to the home's owner. The owner writes it (`drover_owner::home`), clients read it
//! (`drover_client`); both use this one type, so the file cannot drift.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::secret::Secret;

/// The file's name inside the home.
pub const DAEMON_FILE: &str = "daemon.json";

/// `<home>/daemon.json`: `{pid, epoch, instance_id, url, token, started_at, api_key_sha256,
/// start_time}`.
///
/// Holds the bearer token, so it is written 0600 and never printed (the token is a
/// [`Secret`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonInfo {
    /// The daemon's process id.
    pub pid: u32,
    /// The runtime epoch this daemon raised when it started.
    pub epoch: u64,
    /// The random id of this owner instance, raised with the epoch.
    pub instance_id: String,
    /// `ws://127.0.0.1:<port>/v1/ws` (`wss://` with TLS).
    pub url: String,
    /// The bearer token a client sends (`Authorization: Bearer <token>`).
    pub token: Secret,
    /// Unix seconds.
    pub started_at: f64,
    /// Hex SHA-256 ([`api_key_sha256`]) of the API key the daemon holds for new sessions;
    /// absent when it holds none. Never the key itself: a client compares digests to say
    /// "the daemon holds another key than yours".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_sha256: Option<String>,
    /// The daemon's start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`), so
    /// `drover stop` never signals a recycled `pid`; absent from an older daemon's file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
}

/// The hex SHA-256 of an API key, as `daemon.json` `api_key_sha256` carries it.
pub fn api_key_sha256(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_token_and_the_digest_is_hex_sha256() {
        let info = DaemonInfo {
            pid: 1,
            epoch: 2,
            instance_id: "i".into(),
            url: "ws://127.0.0.1:1/v1/ws".into(),
            token: "s3cret-token".into(),
            started_at: 0.0,
            api_key_sha256: Some(api_key_sha256("abc")),
            start_time: Some(7),
        };
        assert!(!format!("{info:?}").contains("s3cret"));
        assert_eq!(
            api_key_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // An older daemon's file (no digest) still reads.
        let old = serde_json::json!({"pid": 1, "epoch": 2, "instance_id": "i",
            "url": "ws://x", "token": "t", "started_at": 0.0});
        let read: DaemonInfo = serde_json::from_value(old).unwrap();
        assert_eq!(read.api_key_sha256, None);
        assert_eq!(read.start_time, None);
    }

    /// `daemon.json` read back equals what was written, whatever the start time: the owner
    /// checks its file every second by that equality, and rewrote it (with a warning) every
    /// second for its whole life when a float did not parse back to the same bits.
    #[test]
    fn every_start_time_reads_back_equal() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Unix seconds with sub-microsecond digits, as `started_at` holds them.
            let started_at =
                1.7e9 + (x % 200_000_000) as f64 + (x >> 11) as f64 / (1u64 << 53) as f64;
            let info = DaemonInfo {
                pid: 1,
                epoch: i,
                instance_id: "i".into(),
                url: "ws://x".into(),
                token: "t".into(),
                started_at,
                api_key_sha256: None,
                start_time: Some(1),
            };
            let text = serde_json::to_string(&info).unwrap();
            let read: DaemonInfo = serde_json::from_str(&text).unwrap();
            assert_eq!(read, info, "{text}");
        }
        let reported = r#"{"pid":1,"epoch":1,"instance_id":"i","url":"ws://x","token":"t","started_at":1796374825.3014905}"#;
        let read: DaemonInfo = serde_json::from_str(reported).unwrap();
        assert_eq!(read.started_at, 1796374825.3014905);
        assert_eq!(
            serde_json::to_string(&read.started_at).unwrap(),
            "1796374825.3014905"
        );
    }
}
