//! Canonical JSON and HMAC-SHA256 signatures (SPEC section 7, "Signing").
//!
//! A message is a JSON object. Its `sig` is the lowercase hex HMAC-SHA256, keyed with a token,
//! of the message without `sig`, serialised with keys sorted at every level, no whitespace, and
//! UTF-8 — byte for byte what Python's
//! `json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` gives. The same
//! rule signs events and state snapshots (with `auth_token`) and, later, dispatches (with the
//! dispatch secret). Verification is constant-time.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The field that holds the signature.
pub const SIG_FIELD: &str = "sig";

/// `value` as canonical JSON: keys sorted at every level (by code point, which is UTF-8 byte
/// order), no whitespace, non-ASCII kept as UTF-8.
///
/// The keys are sorted here rather than trusted to `serde_json::Map`, whose order depends on
/// a cargo feature (`preserve_order`) any crate in the build may switch on.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(&mut out, value);
    out
}

fn write_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_canonical(out, item);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        Value::String(s) => write_string(out, s),
        // null, booleans and numbers print the same in Python and serde_json (numbers in
        // messages are integers and millisecond timestamps).
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`: `"` and `\` escaped, `\b \f
/// \n \r \t` by name, other control characters as `\u00xx` (lowercase), everything else raw.
/// serde_json follows the same table.
fn write_string(out: &mut String, s: &str) {
    out.push_str(&Value::String(s.to_string()).to_string());
}

/// The signature of `message` (an object; any `sig` in it is left out) with `key`.
pub fn sign(message: &Value, key: &str) -> String {
    hex::encode(mac_of(message, key).finalize().into_bytes())
}

/// `message` with its `sig` field set (replacing any old one).
pub fn signed(mut message: Value, key: &str) -> Value {
    let sig = sign(&message, key);
    if let Value::Object(map) = &mut message {
        map.insert(SIG_FIELD.to_string(), Value::String(sig));
    }
    message
}

/// Whether `message` carries a valid `sig` for `key`. The comparison is constant-time
/// (`verify_slice`); a missing, non-string or non-hex `sig` is simply invalid.
pub fn verify(message: &Value, key: &str) -> bool {
    let Some(sig) = message.get(SIG_FIELD).and_then(Value::as_str) else {
        return false;
    };
    let Ok(bytes) = hex::decode(sig) else {
        return false;
    };
    mac_of(message, key).verify_slice(&bytes).is_ok()
}

fn mac_of(message: &Value, key: &str) -> HmacSha256 {
    let body = match message {
        Value::Object(map) => {
            let mut without = map.clone();
            without.remove(SIG_FIELD);
            canonical_json(&Value::Object(without))
        }
        other => canonical_json(other),
    };
    #[allow(clippy::expect_used)]
    let mut mac =
        HmacSha256::new_from_slice(key.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(body.as_bytes());
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "seq": 3,
            "event": "progress",
            "ts": 1717171717.123,
            "detail": "héllo \"wörld\"\n\t\u{1}\u{7f} / ✓ 𝄞",
            "data": {"z": [1, {"b": null, "a": true}], "dispatch_token": "tok", "attempt_id": 2,
                     "é": "accent", "Z": "upper"},
            "job_id": "job-1",
            "neg": -5,
            "whole": 2.0,
        })
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level_without_whitespace() {
        let v = json!({"b": {"d": 1, "c": [ {"y": 1, "x": 2} ]}, "a": "x y"});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"x y","b":{"c":[{"x":2,"y":1}],"d":1}}"#
        );
    }

    #[test]
    fn canonical_json_keeps_unicode_raw_and_escapes_like_python() {
        let v = json!({"k": "é\u{1f}\u{7f}\"\\\u{8}\u{c}\n\r\t✓"});
        assert_eq!(
            canonical_json(&v),
            "{\"k\":\"é\\u001f\u{7f}\\\"\\\\\\b\\f\\n\\r\\t✓\"}"
        );
    }

    #[test]
    fn a_signed_message_verifies_and_any_change_breaks_it() {
        let msg = signed(sample(), "secret");
        assert!(verify(&msg, "secret"));
        assert!(!verify(&msg, "other"));
        let mut changed = msg.clone();
        changed["seq"] = json!(4);
        assert!(!verify(&changed, "secret"));
        let mut nested = msg.clone();
        nested["data"]["attempt_id"] = json!(3);
        assert!(!verify(&nested, "secret"));
        let mut no_sig = msg.clone();
        no_sig.as_object_mut().unwrap().remove("sig");
        assert!(!verify(&no_sig, "secret"));
        let mut bad_hex = msg;
        bad_hex["sig"] = json!("zz");
        assert!(!verify(&bad_hex, "secret"));
    }

    #[test]
    fn the_signature_ignores_key_order_and_an_old_sig() {
        let a = json!({"a": 1, "b": {"c": 2, "d": 3}});
        let b = json!({"b": {"d": 3, "c": 2}, "a": 1, "sig": "stale"});
        assert_eq!(sign(&a, "k"), sign(&b, "k"));
        assert_eq!(sign(&a, "k").len(), 64);
        assert!(sign(&a, "k")
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn known_answer_hmac_sha256() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// The canonical form and the signature match Python's `json.dumps(m, sort_keys=True,
    /// separators=(",", ":"), ensure_ascii=False)` and `hmac`, byte for byte.
    #[test]
    fn canonical_json_and_signature_match_python() {
        use std::io::Write;
        use std::process::{Command, Stdio};

        let msg = sample();
        let script = r#"
import hashlib, hmac, json, sys
m = json.loads(sys.stdin.read())
body = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
sys.stdout.write(body + "\n" + hmac.new(b"secret", body.encode("utf-8"), hashlib.sha256).hexdigest())
"#;
        let child = Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("python3 is not installed; skipping the cross-check");
                return;
            }
            Err(e) => panic!("python3: {e}"),
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(msg.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let (body, sig) = text.rsplit_once('\n').unwrap();
        assert_eq!(canonical_json(&msg), body);
        assert_eq!(sign(&msg, "secret"), sig);
    }
}
