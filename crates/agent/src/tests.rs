//! Unit tests of the loop rules, with an in-memory store, a scripted model double and small
//! test tools. One test goes through the real `ModelClient` and the loopback `MockModel`.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use drover_model::{ChatModel, Completion, ModelError};
use drover_protocol::worker::{
    CompactionRecord, CompactionSummary, ContextWindowFound, TurnOutcome, UsageAdd,
};
use drover_protocol::{ChatMessage, ContextBudget, FunctionCall, Role, ToolCall, Usage};
use drover_tools::{Tool, ToolContext, ToolOutput};
use serde_json::{json, Value};

use crate::context;
use crate::turn_loop::drive;
use crate::{
    run_compaction, Appended, StoreError, TurnReport, TurnSpec, TurnStore, INTERRUPTED_RESULT,
    TOOL_STOP_GRACE,
};

const WAIT: Duration = Duration::from_secs(10);

/// One entry of the shared log: store writes and tool runs, in the order they happened.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Usage(UsageAdd),
    Append {
        messages: Vec<ChatMessage>,
        contexts: BTreeMap<String, String>,
        errors: Vec<String>,
    },
    ToolRan(String),
    Compact(CompactionRecord),
    Window(ContextWindowFound),
}

#[derive(Default)]
struct Log(Mutex<Vec<Entry>>);

impl Log {
    /// Whether a context window found was stored.
    fn window_found(&self) -> bool {
        self.entries().iter().any(|e| matches!(e, Entry::Window(_)))
    }

    fn push(&self, entry: Entry) {
        self.0.lock().unwrap().push(entry);
    }
    fn entries(&self) -> Vec<Entry> {
        self.0.lock().unwrap().clone()
    }
    fn appended(&self) -> Vec<ChatMessage> {
        self.entries()
            .into_iter()
            .flat_map(|e| match e {
                Entry::Append { messages, .. } => messages,
                _ => Vec::new(),
            })
            .collect()
    }
    fn writes(&self) -> usize {
        self.entries()
            .iter()
            .filter(|e| !matches!(e, Entry::ToolRan(_)))
            .count()
    }
}

/// The ledger id [`MemoryStore`] gives the running turn's input; its appended messages get
/// the ids after it.
const INPUT_ID: i64 = 10_000;

/// An in-memory store; `fail_at` makes the write with that index (0-based) fail.
struct MemoryStore {
    log: Arc<Log>,
    deltas: Mutex<Vec<String>>,
    fail_at: Option<usize>,
    /// The id of the last message stored (the input's at first).
    last_id: Mutex<i64>,
}

impl MemoryStore {
    fn new(log: Arc<Log>) -> MemoryStore {
        MemoryStore {
            log,
            deltas: Mutex::new(Vec::new()),
            fail_at: None,
            last_id: Mutex::new(INPUT_ID),
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        if Some(self.log.writes()) == self.fail_at {
            return Err(StoreError {
                reason: "stale_generation".into(),
                message: "execution x is not live".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl TurnStore for MemoryStore {
    async fn append(
        &self,
        messages: Vec<ChatMessage>,
        contexts: BTreeMap<String, String>,
        errors: Vec<String>,
    ) -> Result<Appended, StoreError> {
        self.check()?;
        let mut last = self.last_id.lock().unwrap();
        let message_ids = messages
            .iter()
            .map(|_| {
                *last += 1;
                *last
            })
            .collect();
        self.log.push(Entry::Append {
            messages,
            contexts,
            errors,
        });
        Ok(Appended {
            message_ids,
            input_message_id: Some(INPUT_ID),
        })
    }

    async fn add_usage(&self, usage: UsageAdd) -> Result<(), StoreError> {
        self.check()?;
        self.log.push(Entry::Usage(usage));
        Ok(())
    }

    async fn compact(&self, write: CompactionRecord) -> Result<(), StoreError> {
        self.check()?;
        self.log.push(Entry::Compact(write));
        Ok(())
    }

    async fn context_window_found(&self, found: ContextWindowFound) -> Result<(), StoreError> {
        self.check()?;
        self.log.push(Entry::Window(found));
        Ok(())
    }

    fn delta(&self, text: &str) {
        self.deltas.lock().unwrap().push(text.to_string());
    }
}

/// What the scripted model does for one request.
enum Step {
    Answer(Completion),
    Fail(ModelError),
    /// Never answers (until the future is dropped).
    Hang,
}

/// A test double for the model only: answers requests from a script and records them.
#[derive(Default)]
struct ScriptedModel {
    script: Mutex<VecDeque<Step>>,
    requests: Mutex<Vec<(Vec<ChatMessage>, Vec<Value>)>>,
    /// What `context_window` answers.
    window: Option<u64>,
    /// Answers summarisation requests itself (`SUMMARY-1`, `SUMMARY-2`, ...), outside the
    /// script.
    summaries: bool,
    summarised: Mutex<u64>,
    /// How many summarisation requests to refuse as too long first.
    refuse_summaries: Mutex<u32>,
    /// `context_window` answers `Unreachable`.
    unreachable: bool,
    /// Refuses a request (not a summarisation one) estimated over this many tokens, as a
    /// model refuses one over its window.
    window_limit: Option<u64>,
}

impl ScriptedModel {
    fn new(steps: Vec<Step>) -> ScriptedModel {
        ScriptedModel {
            script: Mutex::new(steps.into()),
            requests: Mutex::default(),
            window: None,
            summaries: false,
            summarised: Mutex::new(0),
            refuse_summaries: Mutex::new(0),
            unreachable: false,
            window_limit: None,
        }
    }
    /// Answers summarisation requests itself.
    fn summarising(mut self) -> ScriptedModel {
        self.summaries = true;
        self
    }
    fn requests(&self) -> Vec<(Vec<ChatMessage>, Vec<Value>)> {
        self.requests.lock().unwrap().clone()
    }
}

#[async_trait]
impl ChatModel for ScriptedModel {
    async fn chat(
        &self,
        messages: &[ChatMessage],
        schemas: &drover_protocol::ToolSchemas,
        on_delta: &mut (dyn for<'d> FnMut(&'d str) + Send),
    ) -> Result<Completion, ModelError> {
        self.requests
            .lock()
            .unwrap()
            .push((messages.to_vec(), schemas.values().unwrap()));
        if self.summaries && is_summary_request(messages) {
            let mut refuse = self.refuse_summaries.lock().unwrap();
            if *refuse > 0 {
                *refuse -= 1;
                return Err(ModelError::ContextExceeded("summary too long".into()));
            }
            drop(refuse);
            let mut n = self.summarised.lock().unwrap();
            *n += 1;
            let Step::Answer(c) = text(&format!("SUMMARY-{n}")) else {
                unreachable!()
            };
            return Ok(c);
        }
        if let Some(limit) = self.window_limit {
            let tokens = (context::message_bytes(messages) + json!(schemas).to_string().len()) / 4;
            if tokens as u64 > limit {
                return Err(ModelError::ContextExceeded(format!(
                    "maximum context length is {limit} tokens, the request has {tokens}"
                )));
            }
        }
        let step = self.script.lock().unwrap().pop_front();
        match step {
            Some(Step::Answer(c)) => {
                if let Some(text) = &c.message.content {
                    on_delta(text);
                }
                Ok(c)
            }
            Some(Step::Fail(e)) => Err(e),
            Some(Step::Hang) => std::future::pending().await,
            None => Err(ModelError::Protocol("script exhausted".into())),
        }
    }

    async fn context_window(&self) -> drover_model::WindowLookup {
        if self.unreachable {
            return drover_model::WindowLookup::Unreachable;
        }
        match self.window {
            Some(tokens) => drover_model::WindowLookup::Reported(tokens),
            None => drover_model::WindowLookup::NotReported,
        }
    }
}

fn usage(i: u64, o: u64) -> Option<Usage> {
    Some(Usage {
        input_tokens: i,
        output_tokens: o,
        total_tokens: i + o,
    })
}

fn text(content: &str) -> Step {
    Step::Answer(Completion {
        message: ChatMessage::text(Role::Assistant, content),
        usage: usage(10, 5),
        usage_extra: Default::default(),
        finish_reason: Some("stop".into()),
        model: None,
    })
}

fn calls(list: &[(&str, &str, &str)]) -> Step {
    let tool_calls = list
        .iter()
        .map(|(id, name, args)| ToolCall {
            id: id.to_string(),
            kind: "function".into(),
            function: FunctionCall {
                name: name.to_string(),
                arguments: args.to_string(),
            },
        })
        .collect();
    Step::Answer(Completion {
        message: ChatMessage {
            role: Role::Assistant,
            content: None,
            tool_calls,
            tool_call_id: None,
            tool_name: None,
        },
        usage: usage(20, 3),
        usage_extra: Default::default(),
        finish_reason: Some("tool_calls".into()),
        model: None,
    })
}

/// `echo {"text"}`: returns the text; `fail`: an error output; `block`: waits for the cancel
/// token like a tool that kills its process group; `hang`: ignores the token.
struct TestTool {
    name: &'static str,
    log: Arc<Log>,
}

#[async_trait]
impl Tool for TestTool {
    fn name(&self) -> &str {
        self.name
    }
    fn schema(&self) -> Value {
        json!({"type": "function", "function": {"name": self.name, "parameters": {}}})
    }
    fn context(&self, args: &Value) -> String {
        format!("{} {}", self.name, args["text"].as_str().unwrap_or(""))
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        self.log.push(Entry::ToolRan(self.name.to_string()));
        match self.name {
            "echo" => ToolOutput {
                content: args["text"].as_str().unwrap_or("").to_string(),
                is_error: false,
            },
            "fail" => ToolOutput {
                content: "exit 1".into(),
                is_error: true,
            },
            "big" => ToolOutput {
                content: "w".repeat(5_500),
                is_error: false,
            },
            "block" => {
                ctx.cancel.cancelled().await;
                ToolOutput {
                    content: "killed".into(),
                    is_error: true,
                }
            }
            _ => std::future::pending().await,
        }
    }
}

struct Fixture {
    log: Arc<Log>,
    store: MemoryStore,
    tools: Vec<Arc<dyn Tool>>,
    ctx: ToolContext,
}

impl Fixture {
    fn new() -> Fixture {
        let log = Arc::new(Log::default());
        let tools = ["echo", "fail", "block", "hang", "big"]
            .into_iter()
            .map(|name| {
                Arc::new(TestTool {
                    name,
                    log: log.clone(),
                }) as Arc<dyn Tool>
            })
            .collect();
        Fixture {
            store: MemoryStore::new(log.clone()),
            log,
            tools,
            ctx: ToolContext {
                approvals: drover_tools::ApprovalMode::Auto.into(),
                ..ToolContext::detached(PathBuf::from("/"), std::env::temp_dir(), "s1")
            },
        }
    }

    async fn run(&self, model: &dyn ChatModel, spec: TurnSpec) -> TurnReport {
        let lookup = |name: &str| self.tools.iter().find(|t| t.name() == name).cloned();
        tokio::time::timeout(WAIT, drive(&self.store, model, &lookup, &self.ctx, spec))
            .await
            .expect("turn did not end in time")
    }
}

fn spec(input: &str) -> TurnSpec {
    TurnSpec {
        system_prompt: "be brief".into(),
        tools: drover_protocol::ToolSchemas::from_values(&[
            json!({"type": "function", "function": {"name": "echo", "description": "frozen"}}),
        ]),
        history: vec![
            ChatMessage::text(Role::User, "earlier"),
            ChatMessage::text(Role::Assistant, "earlier answer"),
        ],
        history_ids: vec![1, 2],
        compaction: None,
        input: input.into(),
        max_steps: 8,
        model: "configured-model".into(),
        context: ContextBudget::default(),
    }
}

#[tokio::test]
async fn request_is_system_then_history_then_input_and_input_is_not_stored() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("hi")]);
    let report = f.run(&model, spec("hello")).await;
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let (messages, _) = &model.requests()[0];
    assert_eq!(
        messages,
        &vec![
            ChatMessage::text(Role::System, "be brief"),
            ChatMessage::text(Role::User, "earlier"),
            ChatMessage::text(Role::Assistant, "earlier answer"),
            ChatMessage::text(Role::User, "hello"),
        ]
    );
    assert_eq!(
        f.log.appended(),
        vec![ChatMessage::text(Role::Assistant, "hi")]
    );
}

#[tokio::test]
async fn empty_system_prompt_is_omitted() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("hi")]);
    let mut s = spec("hello");
    s.system_prompt.clear();
    s.history.clear();
    f.run(&model, s).await;
    let (messages, _) = &model.requests()[0];
    assert_eq!(messages, &vec![ChatMessage::text(Role::User, "hello")]);
}

#[tokio::test]
async fn frozen_tools_and_system_prompt_are_sent_on_every_request() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![
        calls(&[("c1", "echo", r#"{"text":"a"}"#)]),
        calls(&[("c2", "echo", r#"{"text":"b"}"#)]),
        text("done"),
    ]);
    let s = spec("go");
    let frozen = s.tools.values().unwrap();
    let report = f.run(&model, s).await;
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    for (messages, tools) in &requests {
        assert_eq!(tools, &frozen);
        assert_eq!(messages[0], ChatMessage::text(Role::System, "be brief"));
    }
    // The third request carries both rounds of assistant calls and results.
    assert_eq!(requests[2].0.len(), 4 + 4);
}

#[tokio::test]
async fn text_answer_completes_with_usage_and_one_api_call() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("the answer")]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(
        report,
        TurnReport {
            outcome: TurnOutcome::Completed,
            final_response: "the answer".into(),
            model: "configured-model".into(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                total_tokens: 15
            },
            api_calls: 1,
            error: None,
        }
    );
    assert_eq!(
        f.log.entries(),
        vec![
            Entry::Usage(UsageAdd {
                input_tokens: 10,
                output_tokens: 5,
                total_tokens: 15,
                api_calls: 1,
                ..UsageAdd::default()
            }),
            Entry::Append {
                messages: vec![ChatMessage::text(Role::Assistant, "the answer")],
                contexts: BTreeMap::new(),
                errors: vec![],
            },
        ]
    );
}

#[tokio::test]
async fn missing_usage_is_recorded_as_zero_and_usage_is_summed() {
    let f = Fixture::new();
    let mut first = calls(&[("c1", "echo", r#"{"text":"a"}"#)]);
    if let Step::Answer(c) = &mut first {
        c.usage = None;
    }
    let model = ScriptedModel::new(vec![first, text("done")]);
    let report = f.run(&model, spec("q")).await;
    let usages: Vec<UsageAdd> = f
        .log
        .entries()
        .into_iter()
        .filter_map(|e| match e {
            Entry::Usage(u) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(
        usages,
        vec![
            UsageAdd {
                api_calls: 1,
                ..UsageAdd::default()
            },
            UsageAdd {
                input_tokens: 10,
                output_tokens: 5,
                total_tokens: 15,
                api_calls: 1,
                ..UsageAdd::default()
            },
        ]
    );
    assert_eq!(report.api_calls, 2);
    assert_eq!(report.usage.total_tokens, 15);
}

#[tokio::test]
async fn assistant_message_is_stored_with_contexts_before_its_tools_run() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![
        calls(&[
            ("c1", "echo", r#"{"text":"one"}"#),
            ("c2", "nope", r#"{"command":"ls -la"}"#),
            ("c3", "echo", "{bad json"),
        ]),
        text("done"),
    ]);
    f.run(&model, spec("q")).await;
    let entries = f.log.entries();
    let Entry::Append {
        messages, contexts, ..
    } = &entries[1]
    else {
        panic!("second entry should be the assistant append: {entries:?}");
    };
    assert_eq!(messages[0].tool_calls.len(), 3);
    assert_eq!(contexts["c1"], "echo one");
    // Unknown tool, and unparsable arguments: the generic preview.
    assert_eq!(contexts["c2"], "ls -la");
    assert_eq!(contexts["c3"], "\"{bad json\"");
    assert_eq!(entries[2], Entry::ToolRan("echo".into()));
}

#[tokio::test]
async fn tool_results_are_stored_in_order_as_they_finish_with_error_ids() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![
        calls(&[
            ("c1", "echo", r#"{"text":"one"}"#),
            ("c2", "fail", "{}"),
            ("c3", "echo", ""),
        ]),
        text("done"),
    ]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Completed);
    let entries = f.log.entries();
    let expected_tail = vec![
        Entry::ToolRan("echo".into()),
        Entry::Append {
            messages: vec![ChatMessage::tool_result("c1", "echo", "one")],
            contexts: BTreeMap::new(),
            errors: vec![],
        },
        Entry::ToolRan("fail".into()),
        Entry::Append {
            messages: vec![ChatMessage::tool_result("c2", "fail", "exit 1")],
            contexts: BTreeMap::new(),
            errors: vec!["c2".into()],
        },
        Entry::ToolRan("echo".into()),
        Entry::Append {
            messages: vec![ChatMessage::tool_result("c3", "echo", "")],
            contexts: BTreeMap::new(),
            errors: vec![],
        },
    ];
    assert_eq!(entries[2..8].to_vec(), expected_tail);
    // The next request sees the results in call order.
    let (second, _) = &model.requests()[1];
    let ids: Vec<_> = second
        .iter()
        .filter_map(|m| m.tool_call_id.clone())
        .collect();
    assert_eq!(ids, vec!["c1", "c2", "c3"]);
}

#[tokio::test]
async fn bad_json_arguments_give_an_error_result_naming_the_problem() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![calls(&[("c1", "echo", "{\"text\": ")]), text("ok")]);
    f.run(&model, spec("q")).await;
    let result = &f.log.appended()[1];
    let content = result.content.as_deref().unwrap_or("");
    assert!(content.contains("invalid JSON"), "{content}");
    assert!(content.contains("echo"), "{content}");
    assert!(!f.log.entries().contains(&Entry::ToolRan("echo".into())));
    assert!(f
        .log
        .entries()
        .iter()
        .any(|e| matches!(e, Entry::Append { errors, .. } if errors == &vec!["c1".to_string()])));
}

#[tokio::test]
async fn unknown_tool_gives_an_error_result() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![calls(&[("c1", "missing", "{}")]), text("ok")]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Completed);
    assert_eq!(
        f.log.appended()[1],
        ChatMessage::tool_result("c1", "missing", "unknown tool missing")
    );
}

#[tokio::test]
async fn model_error_fails_the_turn_with_the_server_message() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![Step::Fail(ModelError::Http {
        request: "POST http://127.0.0.1:1/v1/chat/completions".into(),
        status: 400,
        message: "context length exceeded".into(),
    })]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    let error = report.error.unwrap_or_default();
    assert!(error.contains("context length exceeded"), "{error}");
    assert!(error.contains("400"), "{error}");
    assert_eq!(report.api_calls, 0);
    assert!(f.log.entries().is_empty());
}

#[tokio::test]
async fn store_error_fails_the_turn_without_further_writes() {
    let mut f = Fixture::new();
    // Write 0 is usage.add, write 1 the assistant message: refuse that one.
    f.store.fail_at = Some(1);
    let model = ScriptedModel::new(vec![calls(&[("c1", "echo", "{}")]), text("never")]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    assert_eq!(
        report.error.as_deref(),
        Some("stale_generation: execution x is not live")
    );
    assert_eq!(f.log.entries().len(), 1, "{:?}", f.log.entries());
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn step_limit_fails_the_turn_after_running_the_last_calls() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![
        calls(&[("c1", "echo", "{}")]),
        calls(&[("c2", "echo", "{}")]),
        text("unreached"),
    ]);
    let mut s = spec("q");
    s.max_steps = 2;
    let report = f.run(&model, s).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    assert_eq!(report.error.as_deref(), Some("step limit (2) reached"));
    assert_eq!(report.api_calls, 2);
    assert_eq!(model.requests().len(), 2);
    // The transcript stays valid: the last call has its result.
    assert_eq!(
        f.log.appended().last().unwrap().tool_call_id.as_deref(),
        Some("c2")
    );
}

#[tokio::test]
async fn server_model_is_reported_else_the_configured_one() {
    let f = Fixture::new();
    let mut first = calls(&[("c1", "echo", "{}")]);
    if let Step::Answer(c) = &mut first {
        c.model = Some("served-model-2024".into());
    }
    let model = ScriptedModel::new(vec![first, text("done")]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.model, "served-model-2024");

    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("done")]);
    assert_eq!(f.run(&model, spec("q")).await.model, "configured-model");
}

#[tokio::test]
async fn deltas_are_forwarded_to_the_store() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("streamed text")]);
    f.run(&model, spec("q")).await;
    assert_eq!(*f.store.deltas.lock().unwrap(), vec!["streamed text"]);
}

#[tokio::test]
async fn cancel_during_a_model_request_interrupts_without_writes() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![Step::Hang]);
    let cancel = f.ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    assert_eq!(report.error, None);
    assert!(f.log.entries().is_empty());
}

#[tokio::test]
async fn cancel_before_the_turn_makes_no_request() {
    let f = Fixture::new();
    f.ctx.cancel.cancel();
    let model = ScriptedModel::new(vec![text("x")]);
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    assert!(model.requests().is_empty());
}

#[tokio::test]
async fn cancel_during_a_tool_closes_every_call_as_interrupted() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![calls(&[
        ("c1", "echo", r#"{"text":"one"}"#),
        ("c2", "block", "{}"),
        ("c3", "echo", "{}"),
    ])]);
    let cancel = f.ctx.cancel.clone();
    let log = f.log.clone();
    tokio::spawn(async move {
        while !log.entries().contains(&Entry::ToolRan("block".into())) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cancel.cancel();
    });
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    let entries = f.log.entries();
    assert_eq!(
        entries.last().unwrap(),
        &Entry::Append {
            messages: vec![
                ChatMessage::tool_result("c2", "block", INTERRUPTED_RESULT),
                ChatMessage::tool_result("c3", "echo", INTERRUPTED_RESULT),
            ],
            contexts: BTreeMap::new(),
            errors: vec!["c2".into(), "c3".into()],
        }
    );
    // c3 never ran; c1's real result was kept.
    let ran: Vec<_> = entries
        .iter()
        .filter(|e| matches!(e, Entry::ToolRan(_)))
        .collect();
    assert_eq!(ran.len(), 2);
    assert!(f
        .log
        .appended()
        .contains(&ChatMessage::tool_result("c1", "echo", "one")));
}

#[tokio::test]
async fn a_tool_that_ignores_cancel_is_dropped_after_the_grace() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![calls(&[("c1", "hang", "{}")])]);
    let cancel = f.ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let started = std::time::Instant::now();
    let report = f.run(&model, spec("q")).await;
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    assert!(started.elapsed() < TOOL_STOP_GRACE + Duration::from_secs(2));
    assert_eq!(
        f.log.appended().last().unwrap(),
        &ChatMessage::tool_result("c1", "hang", INTERRUPTED_RESULT)
    );
}

#[tokio::test]
async fn a_turn_through_the_real_client_and_mock_model() {
    use drover_model::{ModelClient, ModelConfig};
    use drover_test_support::{MockModel, Reply};

    let mock = MockModel::start().await;
    mock.push(Reply::tool_call("call-1", "echo", json!({"text": "pong"})));
    mock.push(Reply::text("all done").usage(7, 3, 10));
    let mut config = ModelConfig::new(mock.base_url(), "mock-model");
    config.max_retries = 0;
    let client = ModelClient::new(config).expect("client");

    let f = Fixture::new();
    let s = spec("ping");
    let frozen = s.tools.clone();
    let report = f.run(&client, s).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(report.final_response, "all done");
    assert_eq!(report.api_calls, 2);
    assert_eq!(report.usage.total_tokens, 15 + 10);

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    for body in &requests {
        assert_eq!(body["tools"], Value::Array(frozen.values().unwrap()));
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][0]["content"], "be brief");
    }
    let second = requests[1]["messages"].as_array().expect("messages");
    let last = second.last().expect("tool result");
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "call-1");
    assert_eq!(last["content"], "pong");
    assert_eq!(f.store.deltas.lock().unwrap().concat(), "all done");
}

/// A history of `turns` earlier turns, each a user message, a tool call and its result of
/// `output_bytes` bytes, then an answer; ids from 1.
fn long_history(turns: usize, output_bytes: usize) -> (Vec<ChatMessage>, Vec<i64>) {
    let mut history = Vec::new();
    for t in 0..turns {
        history.push(ChatMessage::text(Role::User, format!("question {t}")));
        let Step::Answer(call) = calls(&[(&format!("h{t}"), "echo", "{}")]) else {
            unreachable!()
        };
        history.push(call.message);
        history.push(ChatMessage::tool_result(
            format!("h{t}"),
            "echo",
            format!("out{t} ").repeat(output_bytes / 5),
        ));
        history.push(ChatMessage::text(Role::Assistant, format!("answer {t}")));
    }
    let ids = (1..=history.len() as i64).collect();
    (history, ids)
}

fn long_spec(turns: usize, output_bytes: usize, window: u64) -> TurnSpec {
    let (history, history_ids) = long_history(turns, output_bytes);
    TurnSpec {
        history,
        history_ids,
        context: window_of(window),
        ..spec("next")
    }
}

/// `spec` after an earlier compaction whose summary is `SUMMARY-ONE` (7 messages covered).
fn after_summary_one(spec: TurnSpec) -> TurnSpec {
    TurnSpec {
        compaction: Some(CompactionSummary {
            summary: "SUMMARY-ONE".into(),
            through_message_id: 0,
            covered: 7,
        }),
        ..spec
    }
}

/// A turn after `turns` earlier turns of a question and an answer of `answer_bytes` bytes (text
/// is never cut, only summarised), with a window of `window` tokens; ids from 1.
fn text_turns_spec(turns: usize, answer_bytes: usize, window: u64) -> TurnSpec {
    let mut history = Vec::new();
    for t in 0..turns {
        history.push(ChatMessage::text(Role::User, format!("q{t}")));
        history.push(ChatMessage::text(Role::Assistant, "a".repeat(answer_bytes)));
    }
    TurnSpec {
        history_ids: (1..=history.len() as i64).collect(),
        history,
        context: window_of(window),
        ..spec("next")
    }
}

fn compactions(log: &Log) -> Vec<CompactionRecord> {
    log.entries()
        .into_iter()
        .filter_map(|e| match e {
            Entry::Compact(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn is_summary_request(messages: &[ChatMessage]) -> bool {
    messages[0].content.as_deref() == Some(context::SUMMARY_INSTRUCTION)
}

/// Runs a turn of `turns` earlier turns (`tool_bytes` of tool output each) in a context window
/// of `window` tokens; checks it completed without a compaction and gives the messages of its
/// one request.
async fn run_uncompacted(turns: usize, tool_bytes: usize, window: u64) -> Vec<ChatMessage> {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("done")]);
    let report = f.run(&model, long_spec(turns, tool_bytes, window)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert!(compactions(&f.log).is_empty());
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    requests[0].0.clone()
}

#[tokio::test]
async fn a_request_within_the_budget_is_sent_whole_and_nothing_is_compacted() {
    let messages = run_uncompacted(3, 20_000, 100_000).await;
    // system + 3 turns of 4 + the input, tool output whole.
    assert_eq!(messages.len(), 1 + 12 + 1);
    assert!(messages[3].content.as_deref().unwrap().len() >= 20_000);
}

#[tokio::test]
async fn old_tool_output_is_cut_before_anything_is_compacted() {
    // 6 turns of 20 KB: about 30k tokens; the budget is 16k; cut, the old turns weigh ~1k each.
    let messages = run_uncompacted(6, 20_000, 20_000).await;
    assert_eq!(messages.len(), 1 + 24 + 1);
    let tool_outputs: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_deref().unwrap())
        .collect();
    // The first four turns' outputs are cut; the last two turns (kept) are whole.
    for cut in &tool_outputs[..4] {
        assert!(
            cut.contains("were cut here to fit the context window"),
            "{cut}"
        );
        assert!(cut.len() < 5_000);
    }
    for whole in &tool_outputs[4..] {
        assert!(whole.len() >= 20_000);
    }
}

#[tokio::test]
async fn over_the_budget_older_turns_are_summarised_and_stored_first() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("done")]).summarising();
    // 40 turns of 20 KB: cut, still about 40k tokens, over a budget of 8k.
    let report = f.run(&model, long_spec(40, 20_000, 10_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let requests = model.requests();
    let asked = requests.iter().filter(|r| is_summary_request(&r.0)).count() as u64;
    assert!(asked >= 1);
    assert_eq!(report.api_calls, asked + 1);
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1, "{written:?}");
    // Everything but the last two turns (8 messages of 160) is covered, whole turns only.
    assert_eq!(written[0].first_message_id, 1);
    assert_eq!(written[0].last_message_id, 152);
    assert_eq!(written[0].summary, format!("SUMMARY-{asked}"));
    assert_eq!(written[0].usage.api_calls, asked);
    assert!(is_summary_request(&requests[0].0));
    assert!(requests[0].1.is_empty(), "a summary request sends no tools");
    let (messages, tools) = requests.last().unwrap();
    assert_eq!(messages[0].content.as_deref(), Some("be brief"));
    assert_eq!(tools.len(), 1);
    assert!(messages[1]
        .content
        .as_deref()
        .unwrap()
        .ends_with(&format!("SUMMARY-{asked}")));
    assert_eq!(messages[2].content.as_deref(), Some("question 38"));
    assert_eq!(messages.len(), 2 + 8 + 1);
    assert_eq!(messages.last().unwrap().content.as_deref(), Some("next"));
}

#[tokio::test]
async fn context_exceeded_compacts_once_and_retries() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![
        Step::Fail(ModelError::ContextExceeded("maximum context length".into())),
        text("SUMMARY"),
        text("done"),
    ]);
    // Well within the budget by the estimate: only the model's answer shows it is not.
    let report = f.run(&model, long_spec(4, 1_000, 1_000_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1);
    // A forced compaction keeps no earlier turn.
    assert_eq!(written[0].last_message_id, 16);
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[2].0.len(), 1 + 1 + 1);
}

#[tokio::test]
async fn an_empty_summary_is_asked_for_once_more() {
    let f = Fixture::new();
    let exceeded = Step::Fail(ModelError::ContextExceeded("maximum context length".into()));
    let model = ScriptedModel::new(vec![exceeded, text(" \n"), text("SUMMARY"), text("done")]);
    let report = f.run(&model, long_spec(4, 1_000, 1_000_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].summary, "SUMMARY");
    assert_eq!(written[0].usage.api_calls, 2);
}

#[tokio::test]
async fn a_model_that_answers_no_summary_gets_an_excerpt_and_the_turn_goes_on() {
    let f = Fixture::new();
    let exceeded = Step::Fail(ModelError::ContextExceeded("maximum context length".into()));
    let model = ScriptedModel::new(vec![exceeded, text(""), text(""), text("done")]);
    let report = f
        .run(&model, after_summary_one(long_spec(4, 1_000, 1_000_000)))
        .await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(report.final_response, "done");
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1);
    let summary = &written[0].summary;
    // The summary before it, the note, and the covered part's own words.
    assert!(summary.starts_with("SUMMARY-ONE\n\n"), "{summary}");
    assert!(summary.contains(context::EXCERPT_NOTE), "{summary}");
    assert!(summary.contains("question 0"), "{summary}");
    assert_eq!(written[0].usage.api_calls, 2);
    // The request after it stands on the excerpt.
    let requests = model.requests();
    let last = &requests.last().unwrap().0;
    assert!(last[1]
        .content
        .as_deref()
        .unwrap()
        .contains(context::EXCERPT_NOTE));
}

#[tokio::test]
async fn context_exceeded_twice_fails_the_turn_naming_the_sizes() {
    let f = Fixture::new();
    let exceeded = || Step::Fail(ModelError::ContextExceeded("too long".into()));
    let model = ScriptedModel::new(vec![exceeded(), text("SUMMARY"), exceeded()]);
    let report = f.run(&model, long_spec(4, 1_000, 1_000_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    let error = report.error.unwrap();
    assert!(error.starts_with("context_exceeded: "), "{error}");
    assert!(
        error.contains("tokens") && error.contains("bytes"),
        "{error}"
    );
}

#[tokio::test]
async fn context_exceeded_with_nothing_to_shrink_fails_at_once() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![Step::Fail(ModelError::ContextExceeded(
        "too long".into(),
    ))]);
    let report = f
        .run(
            &model,
            TurnSpec {
                history: vec![],
                history_ids: vec![],
                ..spec("short")
            },
        )
        .await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    let error = report.error.unwrap();
    assert!(
        error.contains("nothing is left to compact or cut"),
        "{error}"
    );
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn the_window_is_asked_of_the_endpoint_once_the_history_is_large() {
    let f = Fixture::new();
    let mut model = ScriptedModel::new(vec![text("done")]).summarising();
    model.window = Some(10_000);
    let report = f.run(&model, long_spec(40, 20_000, 0)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert!(f.log.entries().contains(&Entry::Window(ContextWindowFound {
        context_window: 10_000,
        reported: true
    })));
    assert_eq!(compactions(&f.log).len(), 1);

    // A small request never asks.
    let f = Fixture::new();
    let mut model = ScriptedModel::new(vec![text("hi")]);
    model.window = Some(10_000);
    f.run(&model, spec("hello")).await;
    assert!(!f.log.window_found(), "{:?}", f.log.entries());
}

#[tokio::test]
async fn a_later_compaction_folds_in_the_earlier_summary() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("done")]).summarising();
    let report = f
        .run(&model, after_summary_one(long_spec(40, 20_000, 10_000)))
        .await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let requests = model.requests();
    let prompt = requests[0].0[1].content.clone().unwrap();
    assert!(prompt.starts_with("Summary of the session before this part:\nSUMMARY-ONE"));
    // Each later piece folds in the one before it.
    let second = requests[1].0[1].content.clone().unwrap();
    assert!(second.starts_with("Summary of the session before this part:\nSUMMARY-1"));
    assert!(compactions(&f.log)[0].summary.starts_with("SUMMARY-"));
}

#[tokio::test]
async fn a_huge_history_is_summarised_in_pieces_that_each_fit() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("done")]).summarising();
    // 300 turns of assistant answers of 3 KB (never cut): far over a budget of 8k tokens.
    let s = text_turns_spec(300, 3_000, 10_000);
    let report = f.run(&model, s).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let requests = model.requests();
    let summaries: Vec<_> = requests
        .iter()
        .filter(|r| is_summary_request(&r.0))
        .collect();
    assert!(summaries.len() > 1, "{}", summaries.len());
    for (messages, _) in &summaries {
        assert!(context::message_bytes(messages) / 4 <= 8_000 + 1_000);
    }
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].usage.api_calls, summaries.len() as u64);
    assert_eq!(report.api_calls, summaries.len() as u64 + 1);
}

#[test]
fn recent_turns_start_at_user_messages() {
    let (history, _) = long_history(3, 10);
    assert_eq!(context::recent_turns_start(&history, 2), 4);
    assert_eq!(context::recent_turns_start(&history, 3), 0);
    assert_eq!(context::recent_turns_start(&history, 0), 12);
    assert_eq!(context::compaction_plan(&history, 3), None);
    assert_eq!(context::compaction_plan(&history, 1), Some(8));
}

#[test]
fn the_estimate_follows_the_model_count() {
    let mut e = context::Estimator::default();
    assert_eq!(e.tokens(4000), 1000);
    e.counted(4000, 2000);
    assert_eq!(e.tokens(8000), 2000 + 1000);
    assert_eq!(e.tokens(2000), 1000);
}

#[test]
fn cut_text_keeps_head_and_tail_on_char_boundaries() {
    assert_eq!(context::cut_text("short", "x"), None);
    let text = format!("{}{}", "é".repeat(5000), "END");
    let cut = context::cut_text(&text, "tool output").unwrap();
    assert!(cut.starts_with('é') && cut.ends_with("END"));
    assert!(cut.len() < 4 * 1024 + 200);
}

impl Fixture {
    async fn compact(&self, model: &dyn ChatModel, spec: TurnSpec) -> TurnReport {
        tokio::time::timeout(WAIT, run_compaction(&self.store, model, &self.ctx, spec))
            .await
            .expect("the compaction did not end in time")
    }
}

#[tokio::test]
async fn a_compaction_only_turn_summarises_all_but_the_kept_turns_whatever_the_budget() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![]).summarising();
    // 4 small turns in a huge window: a normal turn would send them whole.
    let report = f.compact(&model, long_spec(4, 100, 1_000_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(report.final_response, "compacted 8 messages");
    assert_eq!(report.error, None);
    // One summary request, no tools, nothing of the input; its usage is the turn's.
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    assert!(is_summary_request(&requests[0].0));
    assert!(requests[0].1.is_empty());
    let prompt = requests[0].0[1].content.clone().unwrap();
    assert!(prompt.contains("question 1") && !prompt.contains("question 2"));
    assert!(
        !prompt.contains("next"),
        "the input is not summarised: {prompt}"
    );
    assert_eq!(report.api_calls, 1);
    assert_eq!(report.usage, usage(10, 5).unwrap());
    // The first two turns (8 messages) are covered, whole; the last two are kept.
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(
        (written[0].first_message_id, written[0].last_message_id),
        (1, 8)
    );
    assert_eq!(written[0].summary, "SUMMARY-1");
    assert_eq!(written[0].usage.api_calls, 1);
    // Nothing else was written: no transcript message, no separate usage.
    assert!(f.log.appended().is_empty());
    assert_eq!(f.log.writes(), 1);
}

#[tokio::test]
async fn a_compaction_only_turn_folds_in_the_summary_before_it() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![]).summarising();
    let mut s = long_spec(3, 100, 1_000_000);
    s.context.keep_recent_turns = 0;
    s.compaction = Some(CompactionSummary {
        summary: "SUMMARY-ZERO".into(),
        through_message_id: 0,
        covered: 5,
    });
    let report = f.compact(&model, s).await;
    assert_eq!(report.final_response, "compacted 12 messages", "{report:?}");
    let prompt = model.requests()[0].0[1].content.clone().unwrap();
    assert!(prompt.starts_with("Summary of the session before this part:\nSUMMARY-ZERO"));
    assert_eq!(compactions(&f.log)[0].last_message_id, 12);
}

#[tokio::test]
async fn a_compaction_only_turn_with_no_more_than_the_kept_turns_does_nothing() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![]).summarising();
    let report = f.compact(&model, long_spec(2, 100, 1_000_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(report.final_response, "nothing to compact");
    assert_eq!(report.api_calls, 0);
    assert!(model.requests().is_empty());
    assert_eq!(f.log.writes(), 0);
}

#[tokio::test]
async fn a_compaction_only_turn_fails_on_a_model_error_and_writes_nothing() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![Step::Fail(ModelError::Protocol("bad gateway".into()))]);
    let report = f.compact(&model, long_spec(4, 100, 1_000_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    let error = report.error.unwrap();
    assert!(
        error.contains("bad gateway") && error.contains("while compacting"),
        "{error}"
    );
    assert!(compactions(&f.log).is_empty());

    // Cancelled while the model is asked: interrupted, nothing written.
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![Step::Hang]);
    let cancel = f.ctx.cancel.clone();
    let (report, ()) = tokio::join!(f.compact(&model, long_spec(4, 100, 1_000_000)), async {
        let deadline = tokio::time::Instant::now() + WAIT;
        while model.requests().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cancel.cancel();
    });
    assert_eq!(report.outcome, TurnOutcome::Interrupted);
    assert!(compactions(&f.log).is_empty());
}

#[test]
fn a_long_summary_is_capped() {
    assert_eq!(context::cap_summary("short".into(), 100), "short");
    let capped = context::cap_summary("é".repeat(10_000), 9_999);
    assert!(capped.len() < 9_999 + 80, "{}", capped.len());
    assert!(capped.ends_with("of its 20000 bytes]"), "{capped}");
}

#[tokio::test]
async fn a_summary_longer_than_a_quarter_of_the_budget_is_stored_capped() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text(&"S".repeat(200_000)), text("done")]);
    // One piece: the covered history is small, the budget (8k tokens) is passed by the kept
    // turns' long answers.
    let s = text_turns_spec(4, 12_000, 10_000);
    let report = f.run(&model, s).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let written = compactions(&f.log);
    assert_eq!(written.len(), 1);
    assert!(
        written[0].summary.len() <= 8_192 + 100,
        "{}",
        written[0].summary.len()
    );
}

#[test]
fn summary_pieces_are_bounded_even_for_one_huge_message() {
    let Step::Answer(call) = calls(
        &(0..12)
            .map(|i| (format!("c{i}"), "echo".to_string(), "x".repeat(5_000)))
            .collect::<Vec<_>>()
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
            .collect::<Vec<_>>(),
    ) else {
        unreachable!()
    };
    let covered = vec![ChatMessage::text(Role::User, "q"), call.message];
    let pieces = context::summary_requests(&covered, 16 * 1024);
    assert!(pieces.len() >= 4, "{}", pieces.len());
    assert!(pieces.iter().all(|p| p.len() <= 16 * 1024));
    assert_eq!(pieces.concat(), context::summary_text(&covered));
    // A user line alone is not sent as a piece of its own.
    assert!(pieces[0].len() > 8 * 1024);
}

#[test]
fn the_estimate_counts_json_escapes() {
    assert_eq!(context::json_len("abc"), 3);
    assert_eq!(context::json_len("a\"b\\"), 6);
    assert_eq!(context::json_len("\u{1}"), 6);
    let quoted = vec![ChatMessage::text(Role::Tool, "\"".repeat(1000))];
    assert!(context::message_bytes(&quoted) >= 2000);
}

#[tokio::test]
async fn a_summary_request_refused_as_too_long_is_asked_again_in_smaller_pieces() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text("done")]).summarising();
    *model.refuse_summaries.lock().unwrap() = 1;
    let report = f.run(&model, long_spec(40, 20_000, 10_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(compactions(&f.log).len(), 1);
    let sizes: Vec<usize> = model
        .requests()
        .iter()
        .filter(|r| is_summary_request(&r.0))
        .map(|r| context::message_bytes(&r.0))
        .collect();
    // The refused first piece, then pieces of a quarter of its size.
    assert!(sizes[1] * 2 < sizes[0], "{sizes:?}");
}

#[tokio::test]
async fn a_failed_compaction_still_counts_the_requests_that_answered() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![
        text("PIECE-1"),
        Step::Fail(ModelError::Protocol("gone".into())),
    ]);
    // Two pieces at least: the first answers, the second fails.
    let report = f.run(&model, text_turns_spec(300, 3_000, 10_000)).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    assert!(report
        .error
        .unwrap()
        .ends_with("(while compacting the history)"));
    assert!(compactions(&f.log).is_empty());
    assert!(f
        .log
        .entries()
        .iter()
        .any(|e| matches!(e, Entry::Usage(u) if u.api_calls == 1)));
    assert_eq!(report.api_calls, 1);
}

#[tokio::test]
async fn a_long_running_turn_of_medium_outputs_is_cut_to_fit() {
    let f = Fixture::new();
    // Five tool calls of 5.5 KB each in the running turn, in a window of 8192 tokens.
    let model = ScriptedModel::new(big_calls_then_done(5));
    let s = TurnSpec {
        context: window_of(8_192),
        ..spec("go")
    };
    let report = f.run(&model, s).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    let (last, _) = model.requests().pop().unwrap();
    assert!(context::message_bytes(&last) / 4 <= 8_192 * 8 / 10 + 200);
    // The newest result is whole; older ones of the same turn were cut.
    let outputs: Vec<&str> = last
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_deref().unwrap())
        .collect();
    assert!(outputs.last().unwrap().len() >= 5_500);
    assert!(outputs[0].contains("were cut here"));
}

#[tokio::test]
async fn an_unreachable_models_endpoint_is_not_remembered() {
    let f = Fixture::new();
    let mut model = ScriptedModel::new(vec![text("done")]).summarising();
    model.unreachable = true;
    let report = f.run(&model, long_spec(40, 20_000, 0)).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert!(!f.log.window_found(), "{:?}", f.log.entries());
}

#[tokio::test]
async fn an_answer_too_big_for_a_frame_fails_the_turn_unstored() {
    let f = Fixture::new();
    let model = ScriptedModel::new(vec![text(&"\"".repeat(2 * 1024 * 1024))]);
    let report = f.run(&model, spec("big")).await;
    assert_eq!(report.outcome, TurnOutcome::Failed);
    assert!(report.error.unwrap().contains("bytes one message may hold"));
    assert!(f.log.appended().is_empty());
    assert_eq!(report.final_response, "");
}

#[test]
fn a_running_turn_compacts_whole_steps_and_keeps_the_newest() {
    let input = ChatMessage::text(Role::User, "go");
    let Step::Answer(call) = calls(&[("a", "echo", "{}"), ("b", "echo", "{}")]) else {
        unreachable!()
    };
    let step = |id: &str| {
        vec![
            call.message.clone(),
            ChatMessage::tool_result(format!("{id}1"), "echo", "x"),
            ChatMessage::tool_result(format!("{id}2"), "echo", "y"),
        ]
    };
    // The input and one step: nothing older than the newest step.
    let one: Vec<ChatMessage> = std::iter::once(input.clone()).chain(step("a")).collect();
    assert_eq!(context::running_turn_plan(&one), None);
    assert_eq!(context::running_turn_plan(&one[..1]), None);
    // Three steps: the input and the first two, up to the newest call.
    let three: Vec<ChatMessage> = std::iter::once(input)
        .chain(step("a"))
        .chain(step("b"))
        .chain(step("c"))
        .collect();
    assert_eq!(context::running_turn_plan(&three), Some(7));
    // After a compaction covered the input: the steps left.
    assert_eq!(context::running_turn_plan(&three[4..]), Some(3));
    assert_eq!(context::running_turn_plan(&three[7..]), None);
}

/// A turn of `steps` calls of the 5.5 KB `big` tool, then an answer, with no usage reported
/// (the estimate stays a quarter token a byte), in a window of 8192 tokens that the model
/// enforces; gives the fixture, the model and the report.
async fn run_oversized_turn(steps: usize) -> (Fixture, ScriptedModel, TurnReport) {
    let f = Fixture::new();
    let mut model = ScriptedModel::new(big_calls_then_done(steps)).summarising();
    model.window_limit = Some(8_192);
    let s = TurnSpec {
        max_steps: steps as u32 + 1,
        context: window_of(8_192),
        ..spec("fill the window with big outputs")
    };
    let report = f.run(&model, s).await;
    (f, model, report)
}

/// `steps` calls of the 5.5 KB `big` tool, one a step, then the answer "done". No usage is
/// reported, so the size estimate stays a quarter token a byte.
fn big_calls_then_done(steps: usize) -> Vec<Step> {
    let mut script: Vec<Step> = (0..steps)
        .map(|step| {
            let Step::Answer(mut completion) = calls(&[(&format!("m{step}"), "big", "{}")]) else {
                unreachable!()
            };
            completion.usage = None;
            Step::Answer(completion)
        })
        .collect();
    script.push(text("done"));
    script
}

/// A context budget of the default settings over a window of `tokens`.
fn window_of(tokens: u64) -> ContextBudget {
    ContextBudget {
        context_window: tokens,
        ..ContextBudget::default()
    }
}

/// Checks that every tool result of `messages` answers a call of an assistant message before
/// it, that every call is answered, and that the first message after `[system]` is the user's.
fn assert_pairs_valid(messages: &[ChatMessage]) {
    let mut open: Vec<String> = Vec::new();
    assert_eq!(messages[1].role, Role::User, "{messages:?}");
    for m in messages {
        match m.role {
            Role::Tool => {
                let id = m.tool_call_id.clone().unwrap();
                let at = open.iter().position(|o| *o == id);
                assert!(at.is_some(), "orphan tool result {id}");
                open.remove(at.unwrap());
            }
            _ => {
                assert!(open.is_empty(), "calls without results: {open:?}");
                open = m.tool_calls.iter().map(|c| c.id.clone()).collect();
            }
        }
    }
    assert!(open.is_empty(), "calls without results: {open:?}");
}

#[tokio::test]
async fn a_running_turn_over_the_window_summarises_its_older_steps_and_completes() {
    // 50 results of 5.5 KB: even cut to 1 KiB each, the turn alone passes the budget (6553
    // tokens) after about 20 steps, and again after the first compaction.
    let (f, model, report) = run_oversized_turn(50).await;
    assert_eq!(report.outcome, TurnOutcome::Completed, "{report:?}");
    assert_eq!(report.final_response, "done");
    let written = compactions(&f.log);
    assert!(written.len() >= 2, "{written:?}");
    // The first covers the history and the running turn from its input on, up to a step's
    // last result; the next ones start after it.
    assert_eq!(written[0].first_message_id, 1);
    assert!(written[0].last_message_id > INPUT_ID, "{written:?}");
    for pair in written.windows(2) {
        assert_eq!(pair[1].first_message_id, pair[0].last_message_id + 1);
    }
    let appended = f.log.appended();
    for record in &written {
        let last = &appended[(record.last_message_id - INPUT_ID - 1) as usize];
        assert_eq!(
            last.role,
            Role::Tool,
            "a compaction ends after a step's result"
        );
        // The input is kept whole after each summary of the running turn.
        assert!(
            record.summary.contains(context::INPUT_NOTE),
            "{}",
            record.summary
        );
        assert!(record
            .summary
            .ends_with("\nfill the window with big outputs"));
    }
    let budget = ContextBudget::default().budget_tokens(8_192);
    let requests = model.requests();
    let turn: Vec<&Vec<ChatMessage>> = requests
        .iter()
        .filter(|r| !is_summary_request(&r.0))
        .map(|r| &r.0)
        .collect();
    assert_eq!(turn.len(), 51, "one request a step, none refused");
    let schemas = json!(requests[0].1).to_string().len();
    for messages in &turn {
        let tokens = (context::message_bytes(messages) + schemas) / 4;
        assert!(tokens as u64 <= budget, "{tokens} tokens over {budget}");
        assert_pairs_valid(messages);
    }
    // The last request: the system prompt, the summary (with the input), then the steps after
    // it, the newest result whole.
    let last = turn.last().unwrap();
    assert!(last[1]
        .content
        .as_deref()
        .unwrap()
        .starts_with(context::SUMMARY_HEADER));
    assert!(last[1]
        .content
        .as_deref()
        .unwrap()
        .contains(context::INPUT_NOTE));
    assert_eq!(last[2].role, Role::Assistant);
    assert!(last.last().unwrap().content.as_deref().unwrap().len() >= 5_500);
}
