//! The `clarify` tool (SPEC section 6): the model asks the user one or more questions and waits
//! for the answers.
//!
//! Arguments: `{questions: [{question, choices?, multi_select?}]}`. Each question becomes one
//! `clarify` prompt, opened through [`crate::PromptBroker`] in order, each after the previous
//! one was answered. The prompt body is `{question, choices, multi_select}`; `choices` is
//! always a list (empty for a free-text question) and `multi_select` always a boolean, so
//! clients read one shape. The owner checks the answer against `choices` (a string, or a list of
//! choices when `multi_select`); free-text questions take any string.
//!
//! The result content is JSON `{"answers": [{"question", "answer"}]}`. The wait has no timeout:
//! a question never silently expires. It ends early only when
//! - the turn is interrupted (`ctx.cancel`): error result with `"error": "interrupted"` and the
//!   answers given so far;
//! - the prompt is closed without an answer (the owner cancelled it): error result with
//!   `"error": "cancelled: ..."` and the answers given so far.
//!
//! Bad arguments are an error result whose `error` names the field (`questions[1].choices`).

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use crate::{PromptAnswer, Tool, ToolContext, ToolOutput};

/// At most this many questions per call.
pub const MAX_QUESTIONS: usize = 10;

/// The `error` of a call stopped by an interrupt.
pub const INTERRUPTED: &str = "interrupted";

const DESCRIPTION: &str = "Ask the user one or more questions and wait for the answers. \
Use it when you need a decision or information only the user has; do not use it for \
things you can find out yourself. Each question may offer `choices` (the user picks one, or \
several with `multi_select`); without choices the user answers in free text. Questions are \
asked in order. The result is JSON {\"answers\": [{\"question\", \"answer\"}]}.";

/// The `clarify` tool.
#[derive(Debug, Default)]
pub struct ClarifyTool;

/// One validated question.
#[derive(Debug, Clone, PartialEq)]
struct Question {
    question: String,
    choices: Vec<String>,
    multi_select: bool,
}

impl Question {
    /// The prompt body (SPEC section 2, `prompts`: `question, choices, multi_select`).
    fn body(&self) -> Value {
        json!({
            "question": self.question,
            "choices": self.choices,
            "multi_select": self.multi_select,
        })
    }
}

#[async_trait]
impl Tool for ClarifyTool {
    fn name(&self) -> &str {
        "clarify"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "clarify",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "questions": {
                            "type": "array",
                            "description": "The questions, asked in this order.",
                            "minItems": 1,
                            "maxItems": MAX_QUESTIONS,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "question": {
                                        "type": "string",
                                        "description": "The question, as the user should read it."
                                    },
                                    "choices": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                        "description": "Answers to pick from. Omit for a free-text answer."
                                    },
                                    "multi_select": {
                                        "type": "boolean",
                                        "description": "Whether the user may pick several choices (default false)."
                                    }
                                },
                                "required": ["question"],
                                "additionalProperties": false
                            }
                        }
                    },
                    "required": ["questions"],
                    "additionalProperties": false
                }
            }
        })
    }

    /// The first question, with the number of further ones.
    fn context(&self, args: &Value) -> String {
        let questions = args.get("questions").and_then(Value::as_array);
        let first = questions
            .and_then(|q| q.first())
            .and_then(|q| q.get("question"))
            .and_then(Value::as_str);
        match (first, questions.map(Vec::len)) {
            (Some(text), Some(n)) if n > 1 => crate::one_line(&format!("{text} (+{} more)", n - 1)),
            (Some(text), _) => crate::one_line(text),
            _ => crate::preview(self.name(), args),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let questions = match parse(&args) {
            Ok(questions) => questions,
            Err(message) => return finished(Vec::new(), Some(message)),
        };
        let mut answers = Vec::with_capacity(questions.len());
        for q in &questions {
            if ctx.cancel.is_cancelled() {
                return finished(answers, Some(INTERRUPTED.to_string()));
            }
            let answer = tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    return finished(answers, Some(INTERRUPTED.to_string()));
                }
                answer = ctx.prompts.open("clarify", q.body()) => answer,
            };
            // The owner may have closed the prompt because of the interrupt itself.
            if ctx.cancel.is_cancelled() {
                return finished(answers, Some(INTERRUPTED.to_string()));
            }
            match answer {
                PromptAnswer::Answered(answer) => {
                    answers.push(json!({"question": q.question, "answer": answer}));
                }
                PromptAnswer::Cancelled => {
                    tracing::info!(session_id = %ctx.session_id, "clarify prompt closed without an answer");
                    return finished(
                        answers,
                        Some("cancelled: the question was closed without an answer".to_string()),
                    );
                }
            }
        }
        finished(answers, None)
    }
}

/// The result: `{"answers": [...]}`, plus `"error"` when the call did not finish.
fn finished(answers: Vec<Value>, error: Option<String>) -> ToolOutput {
    let mut content = json!({ "answers": answers });
    let is_error = error.is_some();
    if let Some(error) = error {
        content["error"] = Value::String(error);
    }
    ToolOutput {
        content: content.to_string(),
        is_error,
    }
}

/// Validates `args`; the error names the field and what was wrong with it.
fn parse(args: &Value) -> Result<Vec<Question>, String> {
    let Some(args) = args.as_object() else {
        return Err(format!(
            "arguments must be a JSON object with a \"questions\" list, got {args}"
        ));
    };
    let items = match args.get("questions") {
        None | Some(Value::Null) => return Err(
            "missing required field \"questions\" (a list of {question, choices?, multi_select?})"
                .into(),
        ),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(format!("field \"questions\" must be a list, got {other}")),
    };
    if items.is_empty() {
        return Err("field \"questions\" must hold at least one question".into());
    }
    if items.len() > MAX_QUESTIONS {
        return Err(format!(
            "field \"questions\" holds {} questions; at most {MAX_QUESTIONS} per call",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::Object(fields) => parse_question(i, fields),
            other => Err(format!(
                "field \"questions[{i}]\" must be an object with a \"question\" string, got {other}"
            )),
        })
        .collect()
}

fn parse_question(i: usize, fields: &Map<String, Value>) -> Result<Question, String> {
    let question = match fields.get("question") {
        None | Some(Value::Null) => {
            return Err(format!(
                "missing required field \"questions[{i}].question\""
            ))
        }
        Some(Value::String(q)) if q.trim().is_empty() => {
            return Err(format!(
                "field \"questions[{i}].question\" must not be empty"
            ))
        }
        Some(Value::String(q)) => q.clone(),
        Some(other) => {
            return Err(format!(
                "field \"questions[{i}].question\" must be a string, got {other}"
            ))
        }
    };
    let choices = match fields.get("choices") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(j, choice)| match choice {
                Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
                Value::String(_) => Err(format!(
                    "field \"questions[{i}].choices[{j}]\" must not be empty"
                )),
                other => Err(format!(
                    "field \"questions[{i}].choices[{j}]\" must be a string, got {other}"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(format!(
                "field \"questions[{i}].choices\" must be a list of strings, got {other}"
            ))
        }
    };
    let multi_select = match fields.get("multi_select") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "field \"questions[{i}].multi_select\" must be a boolean, got {other}"
            ))
        }
    };
    if multi_select && choices.is_empty() {
        return Err(format!(
            "field \"questions[{i}].multi_select\" needs \"choices\" to pick from"
        ));
    }
    Ok(Question {
        question,
        choices,
        multi_select,
    })
}

#[cfg(test)]
mod tests {

    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{PromptBroker, ScriptedPrompts};

    fn ctx(prompts: Arc<dyn PromptBroker>) -> ToolContext {
        ToolContext {
            prompts,
            ..ToolContext::detached(std::env::temp_dir(), std::env::temp_dir(), "test-session")
        }
    }

    async fn call(args: Value, ctx: &ToolContext) -> (Value, bool) {
        let out = tokio::time::timeout(Duration::from_secs(10), ClarifyTool.call(args, ctx))
            .await
            .expect("clarify finished within 10 s");
        let content = serde_json::from_str(&out.content).expect("result is JSON");
        (content, out.is_error)
    }

    #[tokio::test]
    async fn asks_each_question_in_order_and_returns_the_answers() {
        let user = ScriptedPrompts::in_order(vec![
            PromptAnswer::Answered(json!("Beta")),
            PromptAnswer::Answered(json!("blue and green")),
            PromptAnswer::Answered(json!(["x", "z"])),
        ]);
        let ctx = ctx(user.clone());
        let (result, is_error) = call(
            json!({"questions": [
                {"question": "Which one?", "choices": ["Alpha", "Beta"]},
                {"question": "Favourite colours?"},
                {"question": "Pick some", "choices": ["x", "y", "z"], "multi_select": true},
            ]}),
            &ctx,
        )
        .await;
        assert!(!is_error, "{result}");
        assert_eq!(
            result,
            json!({"answers": [
                {"question": "Which one?", "answer": "Beta"},
                {"question": "Favourite colours?", "answer": "blue and green"},
                {"question": "Pick some", "answer": ["x", "z"]},
            ]})
        );
        let seen = user.seen();
        assert_eq!(seen.len(), 3);
        assert!(seen.iter().all(|(kind, _)| kind == "clarify"));
        assert_eq!(
            seen[0].1,
            json!({"question": "Which one?", "choices": ["Alpha", "Beta"], "multi_select": false})
        );
        assert_eq!(
            seen[1].1,
            json!({"question": "Favourite colours?", "choices": [], "multi_select": false})
        );
        assert_eq!(seen[2].1["multi_select"], true);
    }

    #[tokio::test]
    async fn a_cancelled_prompt_ends_the_call_with_the_answers_so_far() {
        let user = ScriptedPrompts::in_order(vec![
            PromptAnswer::Answered(json!("yes")),
            PromptAnswer::Cancelled,
        ]);
        let ctx = ctx(user.clone());
        let (result, is_error) = call(
            json!({"questions": [{"question": "one?"}, {"question": "two?"}, {"question": "three?"}]}),
            &ctx,
        )
        .await;
        assert!(is_error);
        assert_eq!(
            result["answers"],
            json!([{"question": "one?", "answer": "yes"}])
        );
        assert!(
            result["error"].as_str().unwrap().starts_with("cancelled"),
            "{result}"
        );
        assert_eq!(user.seen().len(), 2, "the third question is never asked");
    }

    #[tokio::test]
    async fn an_interrupt_while_waiting_stops_the_call() {
        let user = ScriptedPrompts::in_order(Vec::new());
        let ctx = ctx(user.clone());
        let cancel = ctx.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cancel.cancel();
        });
        let (result, is_error) = call(
            json!({"questions": [{"question": "still there?"}, {"question": "never asked"}]}),
            &ctx,
        )
        .await;
        assert!(is_error);
        assert_eq!(result, json!({"answers": [], "error": "interrupted"}));
        assert_eq!(user.seen().len(), 1);
    }

    #[tokio::test]
    async fn an_answer_that_races_the_interrupt_counts_as_interrupted() {
        /// Answers, but fires the turn's cancel token first (the owner closing the prompt
        /// because of the interrupt).
        struct CancelsThenAnswers(CancellationToken);

        #[async_trait]
        impl PromptBroker for CancelsThenAnswers {
            async fn open(&self, _kind: &str, _body: Value) -> PromptAnswer {
                self.0.cancel();
                PromptAnswer::Cancelled
            }
        }
        let cancel = CancellationToken::new();
        let mut ctx = ctx(Arc::new(CancelsThenAnswers(cancel.clone())));
        ctx.cancel = cancel;
        let (result, is_error) = call(json!({"questions": [{"question": "q"}]}), &ctx).await;
        assert!(is_error);
        assert_eq!(result["error"], INTERRUPTED);
    }

    #[tokio::test]
    async fn a_cancelled_context_asks_nothing() {
        let user = ScriptedPrompts::in_order(vec![PromptAnswer::Answered(json!("x"))]);
        let ctx = ctx(user.clone());
        ctx.cancel.cancel();
        let (result, is_error) = call(json!({"questions": [{"question": "q"}]}), &ctx).await;
        assert!(is_error);
        assert_eq!(result["error"], INTERRUPTED);
        assert!(user.seen().is_empty());
    }

    #[tokio::test]
    async fn bad_arguments_name_the_field_and_ask_nothing() {
        let cases = [
            (json!("just a string"), "\"questions\""),
            (json!({}), "\"questions\""),
            (json!({"questions": null}), "\"questions\""),
            (json!({"questions": "Which?"}), "\"questions\""),
            (json!({"questions": []}), "\"questions\""),
            (
                json!({"questions": vec![json!({"question": "q"}); MAX_QUESTIONS + 1]}),
                "\"questions\"",
            ),
            (json!({"questions": ["Which?"]}), "\"questions[0]\""),
            (json!({"questions": [{}]}), "\"questions[0].question\""),
            (
                json!({"questions": [{"question": "ok"}, {"question": "  "}]}),
                "\"questions[1].question\"",
            ),
            (
                json!({"questions": [{"question": 3}]}),
                "\"questions[0].question\"",
            ),
            (
                json!({"questions": [{"question": "q", "choices": "a,b"}]}),
                "\"questions[0].choices\"",
            ),
            (
                json!({"questions": [{"question": "q", "choices": ["a", 2]}]}),
                "\"questions[0].choices[1]\"",
            ),
            (
                json!({"questions": [{"question": "q", "choices": ["a", ""]}]}),
                "\"questions[0].choices[1]\"",
            ),
            (
                json!({"questions": [{"question": "q", "multi_select": "yes", "choices": ["a"]}]}),
                "\"questions[0].multi_select\"",
            ),
            (
                json!({"questions": [{"question": "q", "multi_select": true}]}),
                "\"questions[0].multi_select\"",
            ),
        ];
        for (args, field) in cases {
            let user = ScriptedPrompts::in_order(vec![PromptAnswer::Answered(json!("x"))]);
            let ctx = ctx(user.clone());
            let (result, is_error) = call(args.clone(), &ctx).await;
            assert!(is_error, "{args}");
            let error = result["error"].as_str().expect("error text");
            assert!(error.contains(field), "{args}: {error} should name {field}");
            assert_eq!(result["answers"], json!([]));
            assert!(
                user.seen().is_empty(),
                "{args}: asked despite bad arguments"
            );
        }
    }

    #[test]
    fn schema_is_deterministic_and_names_its_fields() {
        assert_eq!(
            ClarifyTool.schema().to_string(),
            ClarifyTool.schema().to_string()
        );
        let schema = ClarifyTool.schema();
        assert_eq!(schema["function"]["name"], "clarify");
        let params = &schema["function"]["parameters"];
        assert_eq!(params["required"], json!(["questions"]));
        let item = &params["properties"]["questions"]["items"];
        for field in ["question", "choices", "multi_select"] {
            assert!(item["properties"].get(field).is_some(), "{field}");
        }
        assert_eq!(item["required"], json!(["question"]));
    }

    #[test]
    fn the_clarify_toolset_registers_the_tool() {
        let registry = crate::ToolRegistry::for_toolsets(&["terminal".into(), "clarify".into()])
            .expect("known toolsets");
        assert_eq!(registry.names(), ["terminal", "process", "clarify"]);
        assert_eq!(
            registry.schemas()[2],
            ClarifyTool.schema(),
            "the frozen schema is the tool's"
        );
    }

    #[test]
    fn context_previews_the_first_question() {
        assert_eq!(
            ClarifyTool.context(&json!({"questions": [{"question": "Which?"}]})),
            "Which?"
        );
        assert_eq!(
            ClarifyTool.context(&json!({"questions": [{"question": "A?"}, {"question": "B?"}]})),
            "A? (+1 more)"
        );
        let long = "x".repeat(200);
        assert!(
            ClarifyTool
                .context(&json!({"questions": [{"question": long}]}))
                .chars()
                .count()
                <= 80
        );
        // Malformed arguments still give a one-line preview.
        assert!(!ClarifyTool.context(&json!({"q": 1})).is_empty());
    }
}
