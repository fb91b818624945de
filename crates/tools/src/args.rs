//! Reading a tool call's arguments. Every error names the field and says what was wrong with
//! it, so the model can fix its call (STYLE: errors name the field).

use serde_json::{Map, Value};

/// The arguments of one call: a JSON object.
pub(crate) struct Args<'a>(&'a Map<String, Value>);

impl<'a> Args<'a> {
    /// `args` as an object; `shape` says what the tool expects (`{"path": ...}`).
    pub(crate) fn object(args: &'a Value, shape: &str) -> Result<Args<'a>, String> {
        match args {
            Value::Object(fields) => Ok(Args(fields)),
            other => Err(format!(
                "arguments must be a JSON object {shape}, got {other}"
            )),
        }
    }

    /// The field's value; absent and `null` are both `None`.
    pub(crate) fn get(&self, field: &str) -> Option<&'a Value> {
        self.0.get(field).filter(|v| !v.is_null())
    }

    /// A required string; `what` says what it holds, for the "missing" error.
    pub(crate) fn required_str(&self, field: &str, what: &str) -> Result<&'a str, String> {
        match self.get(field) {
            None => Err(format!("missing required field \"{field}\" ({what})")),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(format!("field \"{field}\" must be a string, got {other}")),
        }
    }

    /// A required string that is not empty or blank.
    pub(crate) fn required_text(&self, field: &str, what: &str) -> Result<&'a str, String> {
        let text = self.required_str(field, what)?;
        if text.trim().is_empty() {
            return Err(format!("field \"{field}\" must not be empty"));
        }
        Ok(text)
    }

    /// An optional string that, when given, is not empty or blank.
    pub(crate) fn optional_text(&self, field: &str) -> Result<Option<&'a str>, String> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => {
                Err(format!("field \"{field}\" must not be empty when given"))
            }
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(format!("field \"{field}\" must be a string, got {other}")),
        }
    }

    /// An optional boolean.
    pub(crate) fn optional_bool(&self, field: &str) -> Result<Option<bool>, String> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(format!("field \"{field}\" must be a boolean, got {other}")),
        }
    }

    /// An optional non-negative integer.
    pub(crate) fn optional_count(&self, field: &str) -> Result<Option<u64>, String> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.is_u64() => Ok(n.as_u64()),
            Some(other) => Err(format!(
                "field \"{field}\" must be a non-negative integer, got {other}"
            )),
        }
    }
}

/// A tool error result: JSON `{"error": message}`, `is_error` set.
pub(crate) fn error_output(message: impl Into<String>) -> crate::ToolOutput {
    crate::ToolOutput {
        content: serde_json::json!({ "error": message.into() }).to_string(),
        is_error: true,
    }
}

/// A successful tool result: the JSON text of `value`.
pub(crate) fn json_output(value: &Value) -> crate::ToolOutput {
    crate::ToolOutput {
        content: value.to_string(),
        is_error: false,
    }
}

/// A call's result: the JSON text of the value, or the error.
pub(crate) fn result_output(result: Result<Value, String>) -> crate::ToolOutput {
    match result {
        Ok(value) => json_output(&value),
        Err(message) => error_output(message),
    }
}
