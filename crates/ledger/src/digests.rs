//! Digests the ledger stores and compares: of a secret, of a persist's payload, of a
//! request (idempotency keys), and their constant-time comparison.

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Constant-time equality of two digests (SPEC: secrets are checked in constant time).
pub(crate) fn digests_equal(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Stable digest of a JSON value: of its compact text with object keys in sorted order at
/// every depth. Stored digests are compared across daemon versions and builds, and a crate
/// elsewhere in the build (the ACP SDK) turns on serde_json's `preserve_order`, which would
/// otherwise print keys in the order a client happened to send them.
pub(crate) fn json_digest(v: &serde_json::Value) -> String {
    let mut hasher = HashWriter(Sha256::new());
    // Writing to a hasher cannot fail, and every `Value` serialises.
    let _ = serde_json::to_writer(&mut hasher, &SortedKeys(v));
    hex::encode(hasher.0.finalize())
}

/// A JSON value serialised with its object keys sorted at every depth.
struct SortedKeys<'a>(&'a serde_json::Value);

impl serde::Serialize for SortedKeys<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self.0 {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut out = s.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    out.serialize_entry(key, &SortedKeys(value))?;
                }
                out.end()
            }
            serde_json::Value::Array(items) => s.collect_seq(items.iter().map(SortedKeys)),
            other => other.serialize(s),
        }
    }
}

/// Feeds written bytes to a hash.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digests stored by earlier daemons were of the text with sorted keys; a build where
    /// serde_json keeps insertion order must give the same digest.
    #[test]
    fn a_json_digest_is_of_sorted_keys_whatever_order_they_came_in() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"text":"hi","kind":"input","z":{"b":[{"y":1,"x":2}],"a":null}}"#,
        )
        .expect("json");
        assert_eq!(
            json_digest(&v),
            digest(br#"{"kind":"input","text":"hi","z":{"a":null,"b":[{"x":2,"y":1}]}}"#)
        );
    }
}
