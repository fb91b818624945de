//! The `todo` tool (SPEC section 6): a per-session task list the model keeps.
//!
//! Arguments: `{todos?: [{id, content?, status?}], merge?}`.
//! - No `todos`: the call only shows the list.
//! - `merge` false (the default): the list becomes exactly `todos`, in that order (`[]` clears
//!   it). Each item needs `content`; `status` defaults to `pending`.
//! - `merge` true: each item updates the item with the same `id` (its `content`, its `status`,
//!   or both), or, when the id is new, is appended (then `content` is required).
//!
//! `status` is one of `pending`, `in_progress`, `completed`, `cancelled`. Every result, also an
//! update's, is the whole list: JSON `{todos: [{id, content, status}], summary: {total, pending,
//! in_progress, completed, cancelled}}`, so the transcript shows the list as it stood after
//! each call.
//!
//! **Where the list lives** (`docs/decisions/tools-todo.md`): each turn runs in a new worker
//! process, so the list must outlive the process. It is stored in
//! `<home>/sessions/<session_id>/todo.json` (directories 0700, file 0600, replaced atomically),
//! and read back by the next turn's call. One turn runs per session at a time (SPEC section 4)
//! and a turn's tool calls run in order, so the file has one writer. A child session
//! (delegation) has its own id, so its own list.
//!
//! [`TodoList::apply`] is the pure update, testable without files.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::args::{error_output, json_output, Args};
use crate::file::write_atomic;
use crate::{Tool, ToolContext, ToolOutput};

/// A list holds at most this many items.
pub const MAX_ITEMS: usize = 100;
/// An item's `content` holds at most this many characters.
pub const CONTENT_MAX_CHARS: usize = 2000;

const DESCRIPTION: &str = "Keep a task list for this session, to plan and track multi-step \
work. Call it with no arguments to see the list. With `todos` and no `merge`, the list becomes \
exactly `todos` (send [] to clear it). With `merge: true`, each item updates the item with the \
same `id` (content, status or both) or is added when the id is new. Status is one of pending, \
in_progress, completed, cancelled; keep one item in_progress at a time and mark items completed \
as soon as they are done. The list persists across the turns of the session. The result is the \
whole list as JSON {\"todos\": [{\"id\", \"content\", \"status\"}], \"summary\"}.";

/// The status of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Done.
    Completed,
    /// Dropped without being done.
    Cancelled,
}

impl TodoStatus {
    /// Every status, in the order the summary counts them.
    pub const ALL: [TodoStatus; 4] = [
        TodoStatus::Pending,
        TodoStatus::InProgress,
        TodoStatus::Completed,
        TodoStatus::Cancelled,
    ];

    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            TodoStatus::Pending => "pending",
            TodoStatus::InProgress => "in_progress",
            TodoStatus::Completed => "completed",
            TodoStatus::Cancelled => "cancelled",
        }
    }

    fn parse(word: &str) -> Option<TodoStatus> {
        TodoStatus::ALL.into_iter().find(|s| s.as_str() == word)
    }
}

/// One task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoItem {
    /// The model's id for the task, unique in the list.
    pub id: String,
    /// What the task is.
    pub content: String,
    /// Where it stands.
    pub status: TodoStatus,
}

/// One item of a call: the fields it gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemUpdate {
    /// The task's id.
    pub id: String,
    /// Its new content, if given.
    pub content: Option<String>,
    /// Its new status, if given.
    pub status: Option<TodoStatus>,
}

/// A call that changes the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TodoUpdate {
    /// The call's `todos`.
    pub items: Vec<ItemUpdate>,
    /// `false`: the list becomes `items`; `true`: `items` update or add to it.
    pub merge: bool,
}

/// A session's task list, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoList {
    /// The tasks, in the model's order.
    pub todos: Vec<TodoItem>,
}

impl TodoList {
    /// The list after `update`, or an error naming the field. `update.items` have distinct ids
    /// (the parser checks).
    pub fn apply(&self, update: &TodoUpdate) -> Result<TodoList, String> {
        let mut todos = if update.merge {
            self.todos.clone()
        } else {
            Vec::new()
        };
        for (i, item) in update.items.iter().enumerate() {
            match todos.iter_mut().find(|t| t.id == item.id) {
                Some(existing) => {
                    if let Some(content) = &item.content {
                        existing.content.clone_from(content);
                    }
                    if let Some(status) = item.status {
                        existing.status = status;
                    }
                }
                None => {
                    let Some(content) = &item.content else {
                        return Err(format!(
                            "field \"todos[{i}].content\" is required for a new item (no item has id {:?})",
                            item.id
                        ));
                    };
                    todos.push(TodoItem {
                        id: item.id.clone(),
                        content: content.clone(),
                        status: item.status.unwrap_or(TodoStatus::Pending),
                    });
                }
            }
        }
        if todos.len() > MAX_ITEMS {
            return Err(format!(
                "field \"todos\": the list would hold {} items; at most {MAX_ITEMS}",
                todos.len()
            ));
        }
        Ok(TodoList { todos })
    }

    /// The result JSON: the whole list and a count per status.
    pub fn to_result(&self) -> Value {
        let mut summary = serde_json::Map::new();
        summary.insert("total".into(), json!(self.todos.len()));
        for status in TodoStatus::ALL {
            let n = self.todos.iter().filter(|t| t.status == status).count();
            summary.insert(status.as_str().into(), json!(n));
        }
        json!({ "todos": self.todos, "summary": summary })
    }
}

/// The `todo` tool.
#[derive(Debug, Default)]
pub struct TodoTool;

#[async_trait]
impl Tool for TodoTool {
    fn name(&self) -> &str {
        "todo"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "todo",
                "description": DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "todos": {
                            "type": "array",
                            "description": "The items to set (or, with merge, to update or add). Omit to see the list.",
                            "maxItems": MAX_ITEMS,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": {
                                        "type": "string",
                                        "description": "A short id, unique in the list."
                                    },
                                    "content": {
                                        "type": "string",
                                        "description": "What the task is (required for a new item)."
                                    },
                                    "status": {
                                        "type": "string",
                                        "enum": TodoStatus::ALL.map(TodoStatus::as_str),
                                        "description": "The task's status (default pending for a new item)."
                                    }
                                },
                                "required": ["id"],
                                "additionalProperties": false
                            }
                        },
                        "merge": {
                            "type": "boolean",
                            "description": "Update items by id and add new ones, instead of replacing the list (default false)."
                        }
                    },
                    "additionalProperties": false
                }
            }
        })
    }

    /// What the call does to the list.
    fn context(&self, args: &Value) -> String {
        let merge = args.get("merge").and_then(Value::as_bool).unwrap_or(false);
        match args.get("todos").and_then(Value::as_array) {
            None => "show the list".to_string(),
            Some(items) if merge => format!("update {} item(s)", items.len()),
            Some(items) => format!("set {} item(s)", items.len()),
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> ToolOutput {
        let update = match parse(&args) {
            Ok(update) => update,
            Err(message) => return error_output(message),
        };
        let path = match todo_path(&ctx.home, &ctx.session_id) {
            Ok(path) => path,
            Err(message) => return error_output(message),
        };
        let done = tokio::task::spawn_blocking(move || run(&path, update.as_ref())).await;
        match done {
            Ok(Ok(list)) => json_output(&list.to_result()),
            Ok(Err(message)) => error_output(message),
            Err(e) => error_output(format!("todo failed: {e}")),
        }
    }
}

/// Loads the list, applies `update` and stores the result.
fn run(path: &Path, update: Option<&TodoUpdate>) -> Result<TodoList, String> {
    let current = match (load(path), update) {
        (Ok(list), _) => list,
        // A full replacement does not need the old list: it repairs an unreadable file.
        (Err(_), Some(update)) if !update.merge => TodoList::default(),
        (Err(message), _) => return Err(message),
    };
    let Some(update) = update else {
        return Ok(current);
    };
    let next = current.apply(update)?;
    store(path, &next)?;
    Ok(next)
}

/// `<home>/sessions/<session_id>/todo.json`; the session id must be one plain path component.
pub fn todo_path(home: &Path, session_id: &str) -> Result<PathBuf, String> {
    let mut components = Path::new(session_id).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(_)), None) if !session_id.contains('/') => {
            Ok(home.join("sessions").join(session_id).join("todo.json"))
        }
        _ => Err(format!(
            "the session id {session_id:?} cannot name a directory; the task list is unavailable"
        )),
    }
}

fn load(path: &Path) -> Result<TodoList, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "the task list in {} is unreadable ({e}); call todo with the whole list and no merge to replace it",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TodoList::default()),
        Err(e) => Err(format!("the task list in {} could not be read: {e}", path.display())),
    }
}

fn store(path: &Path, list: &TodoList) -> Result<(), String> {
    let problem = |e: std::io::Error| {
        format!(
            "the task list could not be saved to {}: {e}",
            path.display()
        )
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(problem)?;
    }
    let bytes = serde_json::to_vec_pretty(list).map_err(|e| problem(e.into()))?;
    write_atomic(path, &bytes, Some(0o600), None).map_err(problem)
}

/// Validates `args`; `None` means "show the list".
fn parse(args: &Value) -> Result<Option<TodoUpdate>, String> {
    let args = Args::object(args, "(optionally with \"todos\" and \"merge\")")?;
    let merge = args.optional_bool("merge")?.unwrap_or(false);
    let items = match args.get("todos") {
        None => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(format!(
                "field \"todos\" must be a list of {{id, content, status}} objects, got {other}"
            ))
        }
    };
    if items.len() > MAX_ITEMS {
        return Err(format!(
            "field \"todos\" holds {} items; at most {MAX_ITEMS}",
            items.len()
        ));
    }
    let mut parsed: Vec<ItemUpdate> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item = parse_item(i, item)?;
        if let Some(j) = parsed.iter().position(|p| p.id == item.id) {
            return Err(format!(
                "field \"todos[{i}].id\" repeats the id {:?} of todos[{j}]; ids must be unique",
                item.id
            ));
        }
        parsed.push(item);
    }
    Ok(Some(TodoUpdate {
        items: parsed,
        merge,
    }))
}

fn parse_item(i: usize, item: &Value) -> Result<ItemUpdate, String> {
    let Value::Object(_) = item else {
        return Err(format!(
            "field \"todos[{i}]\" must be an object {{id, content, status}}, got {item}"
        ));
    };
    let fields = Args::object(item, "")?;
    let id = match fields.get("id") {
        None => return Err(format!("missing required field \"todos[{i}].id\"")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(format!("field \"todos[{i}].id\" must not be empty"))
        }
        Some(Value::String(s)) => s.trim().to_string(),
        // Models often number their tasks; an integer id is taken as its decimal text.
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(other) => {
            return Err(format!(
                "field \"todos[{i}].id\" must be a string, got {other}"
            ))
        }
    };
    let content = match fields.get("content") {
        None => None,
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(format!("field \"todos[{i}].content\" must not be empty"))
        }
        Some(Value::String(s)) if s.chars().count() > CONTENT_MAX_CHARS => {
            return Err(format!(
                "field \"todos[{i}].content\" is {} characters long; at most {CONTENT_MAX_CHARS}",
                s.chars().count()
            ))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(format!(
                "field \"todos[{i}].content\" must be a string, got {other}"
            ))
        }
    };
    let status = match fields.get("status") {
        None => None,
        Some(Value::String(s)) => Some(TodoStatus::parse(s).ok_or_else(|| {
            format!(
                "field \"todos[{i}].status\" must be one of pending, in_progress, completed, cancelled, got {s:?}"
            )
        })?),
        Some(other) => {
            return Err(format!(
                "field \"todos[{i}].status\" must be a string, got {other}"
            ))
        }
    };
    Ok(ItemUpdate {
        id,
        content,
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, content: Option<&str>, status: Option<TodoStatus>) -> ItemUpdate {
        ItemUpdate {
            id: id.into(),
            content: content.map(str::to_string),
            status,
        }
    }

    fn list(items: &[(&str, &str, TodoStatus)]) -> TodoList {
        TodoList {
            todos: items
                .iter()
                .map(|(id, content, status)| TodoItem {
                    id: (*id).into(),
                    content: (*content).into(),
                    status: *status,
                })
                .collect(),
        }
    }

    #[test]
    fn replace_sets_the_list_in_order_with_pending_by_default() {
        let before = list(&[("old", "gone", TodoStatus::Pending)]);
        let after = before
            .apply(&TodoUpdate {
                merge: false,
                items: vec![
                    item("b", Some("second"), None),
                    item("a", Some("first"), Some(TodoStatus::InProgress)),
                ],
            })
            .expect("applies");
        assert_eq!(
            after,
            list(&[
                ("b", "second", TodoStatus::Pending),
                ("a", "first", TodoStatus::InProgress)
            ])
        );
    }

    #[test]
    fn merge_updates_by_id_and_appends_new_ids() {
        let before = list(&[
            ("1", "plan", TodoStatus::InProgress),
            ("2", "build", TodoStatus::Pending),
        ]);
        let after = before
            .apply(&TodoUpdate {
                merge: true,
                items: vec![
                    item("1", None, Some(TodoStatus::Completed)),
                    item("2", Some("build it"), Some(TodoStatus::InProgress)),
                    item("3", Some("ship"), None),
                ],
            })
            .expect("applies");
        assert_eq!(
            after,
            list(&[
                ("1", "plan", TodoStatus::Completed),
                ("2", "build it", TodoStatus::InProgress),
                ("3", "ship", TodoStatus::Pending),
            ])
        );
    }

    #[test]
    fn a_new_item_needs_content() {
        let error = TodoList::default()
            .apply(&TodoUpdate {
                merge: true,
                items: vec![item("x", None, Some(TodoStatus::Completed))],
            })
            .expect_err("no content");
        assert!(error.contains("\"todos[0].content\""), "{error}");
    }

    #[test]
    fn merging_past_the_bound_is_refused() {
        let full = TodoList {
            todos: (0..MAX_ITEMS)
                .map(|i| TodoItem {
                    id: i.to_string(),
                    content: "t".into(),
                    status: TodoStatus::Pending,
                })
                .collect(),
        };
        let error = full
            .apply(&TodoUpdate {
                merge: true,
                items: vec![item("new", Some("one too many"), None)],
            })
            .expect_err("too many");
        assert!(error.contains("\"todos\""), "{error}");
    }

    #[test]
    fn the_result_counts_each_status() {
        let result = list(&[
            ("1", "a", TodoStatus::Completed),
            ("2", "b", TodoStatus::InProgress),
            ("3", "c", TodoStatus::Pending),
            ("4", "d", TodoStatus::Pending),
        ])
        .to_result();
        assert_eq!(
            result["summary"],
            json!({"total": 4, "pending": 2, "in_progress": 1, "completed": 1, "cancelled": 0})
        );
        assert_eq!(
            result["todos"][1],
            json!({"id": "2", "content": "b", "status": "in_progress"})
        );
    }

    #[test]
    fn the_todo_path_is_under_the_session_directory() {
        let home = Path::new("/home/u/.drover");
        assert_eq!(
            todo_path(home, "abc-123").expect("plain id"),
            Path::new("/home/u/.drover/sessions/abc-123/todo.json")
        );
        for bad in ["", "..", ".", "a/b", "/abs"] {
            assert!(todo_path(home, bad).is_err(), "{bad:?}");
        }
    }
}
