//! How a browser logs in to the dashboard without weakening the API (SPEC section 1).
//!
//! `drover ui` asks for a one-time code over its bearer-token connection (`ui.login_code`).
//! `GET /ui/login?code=<code>` spends the code (once, within [`LOGIN_CODE_TTL`]) for a login
//! credential, signed with a key drawn at this daemon's start (so a restart ends every login;
//! a handoff passes the key to the next owner, so a `drover restart` keeps them),
//! and redirects to the dashboard with the credential in the URL's fragment, which browsers
//! never send to a server. The page keeps it in its origin's storage and offers it when it
//! opens `/v1/ws`, as the WebSocket subprotocol `drover-auth.<credential>` beside
//! [`PROTOCOL`]. `/v1/ws` takes it only together with an `Origin` equal to the daemon's own
//! origin ([`BrowserAuth::origin`]); every other `Origin` is refused as before, and a request
//! without `Origin` must carry the bearer token as before.
//!
//! Not a cookie: browsers send a host's cookies to every port of it, so a login cookie reached
//! any other server on 127.0.0.1 the browser visited (a tool's dev server), which could then
//! replay it with a forged `Origin` and answer approval prompts. Origin storage is per port.
//!
//! Codes are kept by their SHA-256 only, so a lookup compares digests, never the codes; the
//! credential's MAC is checked in constant time.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use drover_protocol::Secret;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// How long a login code is good for.
pub const LOGIN_CODE_TTL: Duration = Duration::from_secs(60);

/// The most unspent codes kept; past it the oldest goes (each `drover ui` makes one).
const MAX_OPEN_CODES: usize = 64;

/// The WebSocket subprotocol the dashboard asks for, and the daemon selects.
pub const PROTOCOL: &str = "drover.v1";

/// The subprotocol prefix that carries a login credential.
const CREDENTIAL_PROTOCOL: &str = "drover-auth.";

/// The login state of one daemon start.
pub struct BrowserAuth {
    origin: String,
    ttl: Duration,
    /// Drawn at start; replaced once by the key a handoff's old owner hands over.
    key: Mutex<[u8; 32]>,
    /// SHA-256 of each unspent code, with when it expires, oldest first.
    codes: Mutex<VecDeque<([u8; 32], Instant)>>,
}

/// Why a code did not log in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LoginRefusal {
    /// Not a code this daemon start gave, or one already spent.
    #[error("this login link is not valid (already used, or from another daemon start)")]
    Unknown,
    /// Given, but longer ago than the code's lifetime.
    #[error("this login link has expired (a link works within 60 seconds of `drover ui`)")]
    Expired,
}

fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(bytes)
}

fn digest(code: &str) -> [u8; 32] {
    Sha256::digest(code.as_bytes()).into()
}

impl BrowserAuth {
    /// The login state for a daemon whose clients reach it at `origin`
    /// (`http://127.0.0.1:<port>`, or `https://...` with TLS), its codes good for `ttl`
    /// ([`LOGIN_CODE_TTL`]); draws this start's credential key.
    pub fn new(origin: String, ttl: Duration) -> std::io::Result<BrowserAuth> {
        Ok(BrowserAuth {
            origin,
            ttl,
            key: Mutex::new(random_bytes()?),
            codes: Mutex::new(VecDeque::new()),
        })
    }

    /// The credential key, hex, for a handoff's next owner (logins carry on across it).
    pub fn key_hex(&self) -> Secret {
        Secret::new(hex::encode(
            *self.key.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }

    /// Takes the key a handoff's old owner signed its logins with.
    pub fn adopt_key(&self, key: &Secret) -> Result<(), String> {
        let bytes = hex::decode(key.expose()).map_err(|e| format!("the login key: {e}"))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "the login key is not 32 bytes".to_string())?;
        *self.key.lock().unwrap_or_else(|p| p.into_inner()) = key;
        Ok(())
    }

    /// The daemon's own origin: the only `Origin` `/v1/ws` accepts (with a credential).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// How long a code stays good.
    pub fn code_ttl(&self) -> Duration {
        self.ttl
    }

    /// A new one-time code, good for [`BrowserAuth::code_ttl`].
    pub fn issue_code(&self) -> std::io::Result<Secret> {
        let code = hex::encode(random_bytes::<32>()?);
        let now = Instant::now();
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        codes.retain(|(_, expires)| *expires > now);
        while codes.len() >= MAX_OPEN_CODES {
            codes.pop_front();
        }
        codes.push_back((digest(&code), now + self.ttl));
        Ok(Secret::new(code))
    }

    /// The login link for `code`.
    pub fn login_url(&self, code: &Secret) -> Secret {
        Secret::new(format!("{}/ui/login?code={}", self.origin, code.expose()))
    }

    /// Spends `code`: a new login credential (`<nonce>.<mac>`, hex), or why not. A code works
    /// once, expired or not.
    pub fn redeem(&self, code: &str) -> Result<Secret, LoginRefusal> {
        let expires = {
            let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
            let wanted = digest(code);
            let at = codes.iter().position(|(d, _)| *d == wanted);
            at.and_then(|i| codes.remove(i)).map(|(_, expires)| expires)
        };
        match expires {
            None => Err(LoginRefusal::Unknown),
            Some(at) if at <= Instant::now() => Err(LoginRefusal::Expired),
            Some(_) => {
                let nonce = hex::encode(random_bytes::<16>().map_err(|_| LoginRefusal::Unknown)?);
                Ok(Secret::new(format!(
                    "{nonce}.{}",
                    hex::encode(self.mac(&nonce))
                )))
            }
        }
    }

    fn mac(&self, nonce: &str) -> Vec<u8> {
        self.mac_state(nonce).finalize().into_bytes().to_vec()
    }

    fn mac_state(&self, nonce: &str) -> Hmac<Sha256> {
        // A key of any length is accepted by HMAC; this arm never runs.
        let key = *self.key.lock().unwrap_or_else(|p| p.into_inner());
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key)
            .unwrap_or_else(|_| <Hmac<Sha256> as Mac>::new(&Default::default()));
        mac.update(b"drover ui login\0");
        mac.update(nonce.as_bytes());
        mac
    }

    /// Whether a `Sec-WebSocket-Protocol` header offers a login credential of this daemon
    /// start.
    pub fn credential_offered(&self, protocols: &str) -> bool {
        protocols
            .split(',')
            .filter_map(|p| p.trim().strip_prefix(CREDENTIAL_PROTOCOL))
            .any(|value| self.credential_valid(value))
    }

    fn credential_valid(&self, value: &str) -> bool {
        let Some((nonce, mac)) = value.split_once('.') else {
            return false;
        };
        let Ok(mac) = hex::decode(mac) else {
            return false;
        };
        self.mac_state(nonce).verify_slice(&mac).is_ok()
    }

    /// Whether an upgrade with `origin` and `protocols` (the request's `Origin` and
    /// `Sec-WebSocket-Protocol`) is a logged-in dashboard: the origin is exactly ours and a
    /// valid credential is offered.
    pub fn admits(&self, origin: &str, protocols: Option<&str>) -> bool {
        origin == self.origin && protocols.is_some_and(|p| self.credential_offered(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> BrowserAuth {
        BrowserAuth::new("http://127.0.0.1:4242".into(), LOGIN_CODE_TTL).unwrap()
    }

    /// The `Sec-WebSocket-Protocol` header the dashboard sends with `credential`.
    fn offered(credential: &Secret) -> String {
        format!("{PROTOCOL}, {CREDENTIAL_PROTOCOL}{}", credential.expose())
    }

    #[test]
    fn a_code_logs_in_once() {
        let a = auth();
        let code = a.issue_code().unwrap();
        assert_eq!(
            a.login_url(&code).expose(),
            format!("http://127.0.0.1:4242/ui/login?code={}", code.expose())
        );
        let credential = a.redeem(code.expose()).unwrap();
        assert_eq!(a.redeem(code.expose()), Err(LoginRefusal::Unknown));
        assert!(a.admits("http://127.0.0.1:4242", Some(&offered(&credential))));
        assert!(a.admits(
            "http://127.0.0.1:4242",
            Some(&format!("x, {}", offered(&credential)))
        ));
    }

    #[test]
    fn another_origin_a_forged_credential_or_another_start_is_refused() {
        let a = auth();
        let credential = a.redeem(a.issue_code().unwrap().expose()).unwrap();
        let header = offered(&credential);
        assert!(!a.admits("http://localhost:4242", Some(&header)));
        assert!(!a.admits("http://127.0.0.1:4243", Some(&header)));
        assert!(!a.admits("null", Some(&header)));
        assert!(!a.admits("http://127.0.0.1:4242", None));
        assert!(!a.admits("http://127.0.0.1:4242", Some(PROTOCOL)));
        let (nonce, _) = credential.expose().split_once('.').unwrap();
        let forged = format!("{CREDENTIAL_PROTOCOL}{nonce}.{}", "00".repeat(32));
        assert!(!a.admits("http://127.0.0.1:4242", Some(&forged)));
        // A restart draws a new key: the old credential is worthless.
        let restarted = auth();
        assert!(!restarted.admits("http://127.0.0.1:4242", Some(&header)));
        assert_eq!(restarted.redeem("0123"), Err(LoginRefusal::Unknown));
        // A handoff's next owner takes the key: the credential goes on working.
        restarted.adopt_key(&a.key_hex()).unwrap();
        assert!(restarted.admits("http://127.0.0.1:4242", Some(&header)));
        assert!(restarted.adopt_key(&Secret::new("00".to_string())).is_err());
    }

    #[test]
    fn an_expired_code_is_refused_and_spent() {
        let a = auth();
        let code = a.issue_code().unwrap();
        {
            let mut codes = a.codes.lock().unwrap();
            for (_, expires) in codes.iter_mut() {
                *expires = Instant::now() - Duration::from_millis(1);
            }
        }
        assert_eq!(a.redeem(code.expose()), Err(LoginRefusal::Expired));
        assert_eq!(a.redeem(code.expose()), Err(LoginRefusal::Unknown));
    }

    #[test]
    fn open_codes_are_bounded() {
        let a = auth();
        let first = a.issue_code().unwrap();
        for _ in 0..MAX_OPEN_CODES {
            a.issue_code().unwrap();
        }
        assert_eq!(a.codes.lock().unwrap().len(), MAX_OPEN_CODES);
        assert_eq!(a.redeem(first.expose()), Err(LoginRefusal::Unknown));
    }
}
