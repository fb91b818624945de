//! The signed dispatch of a remote job (SPEC section 7, "Remote"): [`Dispatch`], why a runner
//! drops one ([`DispatchDrop`]), its topic, its freshness rule, and the `auth_token` both sides
//! derive from the dispatch secret ([`derive_auth_token`]). Pure: no IO. The orchestrator's
//! and the runner's sides are the `remote` and `runner` modules.

use hmac::Mac;
use serde_json::{json, Value};

use crate::ids::{now, validate_job_id};
use crate::job::Job;
use crate::sign;
use crate::state::{Contract, ContractInput};
use crate::JobError;

/// The variable that holds the shared dispatch secret.
pub const DISPATCH_SECRET_ENV: &str = "DROVER_DISPATCH_SECRET";

/// The dispatch secret from the variable's value: refused when unset or empty.
pub fn dispatch_secret(value: Option<String>) -> Result<String, JobError> {
    value.filter(|s| !s.is_empty()).ok_or_else(|| {
        JobError::BadInput(format!(
            "${DISPATCH_SECRET_ENV} is not set: remote dispatches are signed with this shared \
             secret (set the same value on the orchestrator and the runner)"
        ))
    })
}

/// `<topic_base>/runners/<name>/dispatch`.
pub fn dispatch_topic(topic_base: &str, runner: &str) -> String {
    format!(
        "{}/runners/{runner}/dispatch",
        topic_base.trim_end_matches('/')
    )
}

/// A runner name: the same characters as a job id, so it is one plain topic level.
pub fn validate_runner_name(name: &str) -> Result<(), JobError> {
    validate_job_id(name).map_err(|_| {
        JobError::BadInput(format!(
            "runner name {name:?}: use 1-64 of A-Z a-z 0-9 . _ - (not starting with - or .)"
        ))
    })
}

/// The job's `auth_token`, derived from the dispatch secret (see the module doc).
pub fn derive_auth_token(secret: &str, job_id: &str, attempt_id: u64) -> String {
    let mut mac = sign::hmac_sha256(secret);
    mac.update(format!("auth|{job_id}|{attempt_id}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The default of `[jobs] dispatch_max_age_s`: a day.
pub const DEFAULT_DISPATCH_MAX_AGE_S: u64 = 86_400;

/// How far ahead of the runner's clock a dispatch's `ts` may be (clock skew between the two
/// hosts), capped at the max age itself.
pub const DISPATCH_CLOCK_SKEW_S: u64 = 300;

/// One dispatch, as the runner admits it.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The runner it is for (`remote:<name>`, `drover runner --session NAME`).
    pub runner: String,
    /// The job.
    pub job_id: String,
    /// The attempt this dispatch starts.
    pub attempt_id: u64,
    /// The attempt's `dispatch_token`.
    pub dispatch_token: String,
    /// The job's `<topic_base>/jobs/<job_id>`, where the runner publishes.
    pub topic_prefix: String,
    /// The task, written into the runner's brief.
    pub prompt: String,
    /// The liveness contract the runner's heartbeats keep.
    pub contract: Contract,
    /// When the orchestrator signed it (Unix seconds).
    pub ts: f64,
}

/// Why a runner dropped a message on its dispatch topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchDrop {
    /// The payload is not a JSON object.
    #[error("not a JSON object")]
    Malformed,
    /// The `sig` does not verify with the dispatch secret (or there is none).
    #[error("unsigned or badly signed (not signed with this runner's dispatch secret)")]
    BadSignature,
    /// Signed, but a field is missing or out of range (the text names it).
    #[error("signed, but unusable: {0}")]
    Invalid(String),
    /// `ts` is older than `[jobs] dispatch_max_age_s`.
    #[error(
        "expired: signed {age_s} s ago, more than [jobs] dispatch_max_age_s = {max_age_s} \
         (config.toml of the runner's home)"
    )]
    TooOld {
        /// How long ago it was signed, in whole seconds (rounded up).
        age_s: u64,
        /// `[jobs] dispatch_max_age_s`.
        max_age_s: u64,
    },
    /// `ts` is further ahead of this host's clock than the allowed clock skew.
    #[error(
        "dated {ahead_s} s ahead of this host's clock, more than the {skew_s} s of clock skew \
         allowed"
    )]
    FromTheFuture {
        /// How far ahead it is dated, in whole seconds (rounded up).
        ahead_s: u64,
        /// The skew allowed: [`DISPATCH_CLOCK_SKEW_S`], or the max age if smaller.
        skew_s: u64,
    },
}

impl Dispatch {
    /// The dispatch of `job` to `runner`.
    pub fn of(job: &Job, runner: &str) -> Dispatch {
        Dispatch {
            runner: runner.to_string(),
            job_id: job.job_id.clone(),
            attempt_id: job.attempt_id,
            dispatch_token: job.dispatch_token.clone(),
            topic_prefix: job.topic_prefix.clone(),
            prompt: job.prompt.clone(),
            contract: job.contract,
            ts: now(),
        }
    }

    /// The signed message.
    pub fn to_message(&self, secret: &str) -> Value {
        let contract = self.contract;
        sign::signed(
            json!({
                "event": "dispatch",
                "runner": self.runner,
                "job_id": self.job_id,
                "attempt_id": self.attempt_id,
                "dispatch_token": self.dispatch_token,
                "topic_prefix": self.topic_prefix,
                "prompt": self.prompt,
                "contract": {
                    "heartbeat_sec": contract.heartbeat_sec,
                    "heartbeat_misses": contract.heartbeat_misses,
                    "ack_timeout_sec": contract.ack_timeout_sec,
                    "idle_timeout_sec": contract.idle_timeout_sec,
                },
                "ts": self.ts,
            }),
            secret,
        )
    }

    /// Verifies (constant-time) and reads a dispatch. The signature is checked before any
    /// field is trusted.
    pub fn parse_verified(payload: &[u8], secret: &str) -> Result<Dispatch, DispatchDrop> {
        let message: Value =
            serde_json::from_slice(payload).map_err(|_| DispatchDrop::Malformed)?;
        if !message.is_object() {
            return Err(DispatchDrop::Malformed);
        }
        // Verified from the text: its numbers as the signer wrote them.
        if !sign::verify_text(payload, secret) {
            return Err(DispatchDrop::BadSignature);
        }
        let text = |k: &str| {
            message[k]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| DispatchDrop::Invalid(format!("no {k}")))
        };
        if message["event"].as_str() != Some("dispatch") {
            return Err(DispatchDrop::Invalid("event is not \"dispatch\"".into()));
        }
        let attempt_id = message["attempt_id"]
            .as_u64()
            .filter(|a| *a >= 1)
            .ok_or_else(|| DispatchDrop::Invalid("no attempt_id".into()))?;
        let sent = &message["contract"];
        let contract = Contract::derive(ContractInput {
            heartbeat_sec: sent["heartbeat_sec"].as_u64(),
            heartbeat_misses: sent["heartbeat_misses"].as_u64(),
            ack_timeout_sec: sent["ack_timeout_sec"].as_u64(),
            idle_timeout_sec: sent["idle_timeout_sec"].as_u64(),
        })
        .map_err(|e| DispatchDrop::Invalid(e.to_string()))?;
        let job_id = text("job_id")?;
        validate_job_id(&job_id).map_err(|e| DispatchDrop::Invalid(e.to_string()))?;
        let ts = message["ts"]
            .as_f64()
            .ok_or_else(|| DispatchDrop::Invalid("no ts".into()))?;
        Ok(Dispatch {
            runner: text("runner")?,
            job_id,
            attempt_id,
            dispatch_token: text("dispatch_token")?,
            topic_prefix: text("topic_prefix")?,
            prompt: text("prompt")?,
            contract,
            ts,
        })
    }

    /// Whether the dispatch is fresh at `now` (Unix seconds): signed at most `max_age_s`
    /// ago, and at most [`DISPATCH_CLOCK_SKEW_S`] (or `max_age_s`, if smaller) ahead.
    pub fn check_age(&self, now: f64, max_age_s: u64) -> Result<(), DispatchDrop> {
        let age = now - self.ts;
        let skew_s = DISPATCH_CLOCK_SKEW_S.min(max_age_s);
        if age > max_age_s as f64 {
            Err(DispatchDrop::TooOld {
                age_s: age.ceil() as u64,
                max_age_s,
            })
        } else if -age > skew_s as f64 {
            Err(DispatchDrop::FromTheFuture {
                ahead_s: (-age).ceil() as u64,
                skew_s,
            })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn dispatch() -> Dispatch {
        Dispatch {
            runner: "r1".into(),
            job_id: "j1".into(),
            attempt_id: 2,
            dispatch_token: "tok".into(),
            topic_prefix: "drover/v1/jobs/j1".into(),
            prompt: "do it".into(),
            contract: Contract::default(),
            ts: 1_700_000_000.5,
        }
    }

    #[test]
    fn a_dispatch_round_trips_only_with_the_secret() {
        let d = dispatch();
        let m = d.to_message("s3cret");
        let bytes = m.to_string().into_bytes();
        assert_eq!(Dispatch::parse_verified(&bytes, "s3cret"), Ok(d.clone()));
        assert_eq!(
            Dispatch::parse_verified(&bytes, "other"),
            Err(DispatchDrop::BadSignature)
        );
        let mut unsigned = m.clone();
        unsigned.as_object_mut().unwrap().remove("sig");
        assert_eq!(
            Dispatch::parse_verified(unsigned.to_string().as_bytes(), "s3cret"),
            Err(DispatchDrop::BadSignature)
        );
        let mut tampered = m;
        tampered["attempt_id"] = json!(3);
        assert_eq!(
            Dispatch::parse_verified(tampered.to_string().as_bytes(), "s3cret"),
            Err(DispatchDrop::BadSignature)
        );
        assert_eq!(
            Dispatch::parse_verified(b"nope", "s3cret"),
            Err(DispatchDrop::Malformed)
        );
    }

    /// A dispatch a Python orchestrator signed, with fields this runner does not read that
    /// hold a float below 1e-4 (`1e-05` in Python) and an integer beyond 64 bits, is admitted.
    #[test]
    fn a_dispatch_signed_by_python_with_small_floats_and_big_integers_is_admitted() {
        let script = r#"
import hashlib, hmac, json, sys
m = {"event": "dispatch", "runner": "r1", "job_id": "j1", "attempt_id": 2,
     "dispatch_token": "tok", "topic_prefix": "drover/v1/jobs/j1", "prompt": "do it",
     "contract": {"heartbeat_sec": 30, "heartbeat_misses": 4, "ack_timeout_sec": 180,
                  "idle_timeout_sec": 120},
     "ts": 1700000000.5, "budget": {"usd": 0.00005, "tokens": 10**30}}
body = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
m["sig"] = hmac.new(b"py-secret", body.encode("utf-8"), hashlib.sha256).hexdigest()
sys.stdout.write(json.dumps(m))
"#;
        let payload = sign::python(script, b"");
        assert_eq!(
            Dispatch::parse_verified(&payload, "py-secret"),
            Ok(dispatch()),
            "{}",
            String::from_utf8_lossy(&payload)
        );
    }

    #[test]
    fn a_dispatch_is_fresh_only_within_the_max_age_and_the_clock_skew() {
        let d = dispatch();
        let ts = d.ts;
        assert_eq!(d.check_age(ts, 86_400), Ok(()));
        assert_eq!(d.check_age(ts + 86_400.0, 86_400), Ok(()));
        assert_eq!(
            d.check_age(ts + 86_400.5, 86_400),
            Err(DispatchDrop::TooOld {
                age_s: 86_401,
                max_age_s: 86_400
            })
        );
        // Stamped in 2001 (ts 1e9), seen in 2023.
        let mut old = d.clone();
        old.ts = 1_000_000_000.0;
        assert!(matches!(
            old.check_age(ts, 86_400),
            Err(DispatchDrop::TooOld { .. })
        ));
        assert_eq!(d.check_age(ts - 300.0, 86_400), Ok(()));
        assert_eq!(
            d.check_age(ts - 301.0, 86_400),
            Err(DispatchDrop::FromTheFuture {
                ahead_s: 301,
                skew_s: 300
            })
        );
        // The skew never exceeds a smaller max age.
        assert_eq!(
            d.check_age(ts - 11.0, 10),
            Err(DispatchDrop::FromTheFuture {
                ahead_s: 11,
                skew_s: 10
            })
        );
        assert!(DispatchDrop::TooOld {
            age_s: 5,
            max_age_s: 1
        }
        .to_string()
        .contains("[jobs] dispatch_max_age_s = 1"));
    }

    #[test]
    fn a_dispatch_without_a_numeric_ts_is_refused() {
        for ts in [json!(null), json!("2024-01-01")] {
            let mut m = dispatch().to_message("s");
            m["ts"] = ts;
            let m = sign::signed(m, "s");
            assert_eq!(
                Dispatch::parse_verified(m.to_string().as_bytes(), "s"),
                Err(DispatchDrop::Invalid("no ts".into()))
            );
        }
    }

    #[test]
    fn the_auth_token_is_derived_per_job_and_attempt_and_never_in_the_dispatch() {
        let a = derive_auth_token("s", "j1", 1);
        assert_eq!(a.len(), 64);
        assert_eq!(a, derive_auth_token("s", "j1", 1));
        assert_ne!(a, derive_auth_token("s", "j1", 2));
        assert_ne!(a, derive_auth_token("s", "j2", 1));
        assert_ne!(a, derive_auth_token("t", "j1", 1));
        let text = dispatch().to_message("s").to_string();
        assert!(!text.contains(&derive_auth_token("s", "j1", 2)));
    }

    #[test]
    fn a_missing_or_empty_secret_is_refused() {
        assert!(dispatch_secret(None).is_err());
        assert!(dispatch_secret(Some(String::new())).is_err());
        assert_eq!(dispatch_secret(Some("x".into())).unwrap(), "x");
    }
}
