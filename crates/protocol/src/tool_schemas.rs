//! A session's tool schemas as frozen at `session.create`: one JSON array, kept as its text
//! from the ledger's row through the worker's bootstrap to the model request's `tools`.
//!
//! A warm turn used to parse the array into a `serde_json::Value` tree three times (the
//! ledger's row, the worker's bootstrap, and again serialized for the request): about 0.3 ms of
//! a turn for schemas nothing on that path reads. [`ToolSchemas`] checks the text is a JSON
//! array once, when it is made, and is written out byte for byte; the few readers that need
//! the objects (a subagent's subset, MCP tools, the Responses API's shape) parse them with
//! [`ToolSchemas::values`].

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON array of tool schemas, kept as its text (see the module's front); `None` is the
/// empty array.
#[derive(Clone, Default)]
pub struct ToolSchemas(Option<Box<RawValue>>);

/// Why a text is not a tool schemas array.
#[derive(Debug, thiserror::Error)]
pub enum ToolSchemasError {
    /// Not JSON at all.
    #[error("tool schemas are not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON, but not an array.
    #[error("tool schemas are not a JSON array")]
    NotArray,
}

impl ToolSchemas {
    /// The array of `values`.
    pub fn from_values(values: &[Value]) -> ToolSchemas {
        if values.is_empty() {
            return ToolSchemas(None);
        }
        // A slice of values always serializes.
        ToolSchemas(serde_json::value::to_raw_value(values).ok())
    }

    /// `text` when it is a JSON array (checked once, without building the values).
    pub fn from_json(text: String) -> Result<ToolSchemas, ToolSchemasError> {
        ToolSchemas::checked(RawValue::from_string(text)?).ok_or(ToolSchemasError::NotArray)
    }

    fn checked(raw: Box<RawValue>) -> Option<ToolSchemas> {
        let text = raw.get();
        let inner = text.strip_prefix('[')?;
        Some(if inner.trim_start().starts_with(']') {
            ToolSchemas(None)
        } else {
            ToolSchemas(Some(raw))
        })
    }

    /// The schemas as values, parsed now.
    pub fn values(&self) -> Result<Vec<Value>, serde_json::Error> {
        match &self.0 {
            Some(raw) => serde_json::from_str(raw.get()),
            None => Ok(Vec::new()),
        }
    }

    /// The array's JSON text, as it is sent.
    pub fn json(&self) -> &str {
        self.0.as_deref().map_or("[]", RawValue::get)
    }

    /// The array as a raw value for a request body; `None` when it is empty (a request
    /// without tools leaves the field out).
    pub fn raw(&self) -> Option<&RawValue> {
        self.0.as_deref()
    }

    /// Whether the array has no schema.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Debug for ToolSchemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ToolSchemas").field(&self.json()).finish()
    }
}

impl PartialEq for ToolSchemas {
    fn eq(&self, other: &ToolSchemas) -> bool {
        self.json() == other.json()
    }
}

impl Serialize for ToolSchemas {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Some(raw) => raw.serialize(serializer),
            None => serializer.collect_seq(std::iter::empty::<Value>()),
        }
    }
}

/// The name serde_json's deserializer knows a raw value by (`RawValue`'s own `Deserialize`
/// asks for it): it then hands over the value's text unparsed, as one map entry. A
/// deserializer that does not know it (a frame buffered by an internally tagged enum, such as
/// `OwnerFrame`) hands over the value itself, which is read the slow way; so would serde_json
/// if the name ever changed: slower, never wrong.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de> Deserialize<'de> for ToolSchemas {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ToolSchemas, D::Error> {
        deserializer.deserialize_newtype_struct(RAW_VALUE_TOKEN, SchemasVisitor)
    }
}

struct SchemasVisitor;

impl<'de> Visitor<'de> for SchemasVisitor {
    type Value = ToolSchemas;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of tool schemas")
    }

    /// serde_json: the array's text, unparsed.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ToolSchemas, A::Error> {
        let key: Option<String> = map.next_key()?;
        if key.as_deref() != Some(RAW_VALUE_TOKEN) {
            return Err(A::Error::custom("tool schemas are not a JSON array"));
        }
        let text: String = map.next_value()?;
        ToolSchemas::from_json(text).map_err(A::Error::custom)
    }

    /// Any other deserializer: the values themselves.
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<ToolSchemas, D::Error> {
        Ok(ToolSchemas::from_values(&Vec::<Value>::deserialize(d)?))
    }
}

impl JsonSchema for ToolSchemas {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        Vec::<Value>::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        Vec::<Value>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_are_written_byte_for_byte_and_parsed_only_when_asked() {
        let text = r#"[{"type":"function","function":{"name":"a","parameters":{"b":1,"a":2}}}]"#;
        let schemas = ToolSchemas::from_json(text.to_string()).expect("array");
        assert_eq!(serde_json::to_string(&schemas).expect("json"), text);
        #[derive(Serialize)]
        struct Body<'a> {
            tools: &'a ToolSchemas,
        }
        assert_eq!(
            serde_json::to_string(&Body { tools: &schemas }).expect("json"),
            format!(r#"{{"tools":{text}}}"#)
        );
        let back: ToolSchemas = serde_json::from_str(text).expect("read");
        assert_eq!(back, schemas);
        let values = schemas.values().expect("values");
        assert_eq!(values[0]["function"]["name"], "a");
        assert_eq!(
            ToolSchemas::from_values(&values).values().expect("again"),
            values
        );
        assert!(!schemas.is_empty());
        assert!(ToolSchemas::default().is_empty());
        assert!(ToolSchemas::from_json(" [ ] ".into())
            .expect("array")
            .is_empty());
        assert_eq!(
            serde_json::to_string(&ToolSchemas::default()).expect("json"),
            "[]"
        );
    }

    #[test]
    fn a_text_that_is_not_a_json_array_is_refused() {
        assert!(matches!(
            ToolSchemas::from_json("{\"a\":1}".into()),
            Err(ToolSchemasError::NotArray)
        ));
        assert!(matches!(
            ToolSchemas::from_json("[1,".into()),
            Err(ToolSchemasError::Json(_))
        ));
        assert!(serde_json::from_str::<ToolSchemas>("{}").is_err());
        // From a value tree too (a frame read as a `Value` first).
        let read: ToolSchemas = serde_json::from_value(json!([{"x": 1}])).expect("from a value");
        assert_eq!(read.values().expect("values"), vec![json!({"x": 1})]);
    }

    #[test]
    fn schemas_are_read_through_a_buffered_tagged_frame_too() {
        #[derive(Deserialize, Debug)]
        #[serde(tag = "type")]
        enum Frame {
            #[serde(rename = "head")]
            Head { tools: ToolSchemas },
        }
        let text = r#"{"type":"head","tools":[{"x":1},{"y":[2]}]}"#;
        let Frame::Head { tools } = serde_json::from_str(text).expect("tagged");
        assert_eq!(tools.json(), r#"[{"x":1},{"y":[2]}]"#);
        let bad = serde_json::from_str::<Frame>(r#"{"type":"head","tools":{"x":1}}"#);
        assert!(bad.is_err());
        // Direct: the text as sent, never re-serialized.
        let direct: ToolSchemas = serde_json::from_str(r#"[ {"b":1,"a":2} ]"#).expect("direct");
        assert_eq!(direct.json(), r#"[ {"b":1,"a":2} ]"#);
    }
}
