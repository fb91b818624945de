// Test helpers: clippy.toml's allow-unwrap-in-tests covers only #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox through the real `terminal`, `process` and file tools: real `sh`
//! processes under a real user namespace and Landlock (this machine has both). Each refusal
//! is checked against the same call with the sandbox off, so a test fails when its layer is
//! switched off.

use crate::common::call;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use drover_platform::confine::probe;
use drover_protocol::sandbox::{SandboxMode, SandboxPolicy, SandboxSupport, ToolEnv};
use drover_test_support::outside_path;
use drover_tools::file::write::WriteFileTool;
use drover_tools::process::ProcessTool;
use drover_tools::sandbox::Sandbox;
use drover_tools::terminal::TerminalTool;
use drover_tools::{NoPrompts, PromptAnswer, PromptBroker, ScriptedPrompts, ToolContext};
use serde_json::{json, Value};

struct Dirs {
    cwd: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let dirs = Dirs {
            cwd: tempfile::tempdir().expect("cwd"),
            home: tempfile::tempdir().expect("home"),
        };
        std::fs::write(
            dirs.home.path().join("daemon.json"),
            "{\"token\":\"tok-31337\"}",
        )
        .expect("daemon.json");
        dirs
    }

    fn policy(&self, mode: SandboxMode, network: bool) -> SandboxPolicy {
        let support = probe();
        SandboxPolicy {
            mode,
            writable_roots: vec![self.cwd.path().display().to_string()],
            network,
            hidden: vec![self.home.path().display().to_string()],
            required: false,
            support: SandboxSupport {
                namespaces: support.namespaces,
                landlock_abi: support.landlock_abi,
                problems: support.problems,
            },
            env: ToolEnv::default(),
        }
    }

    fn ctx_with(
        &self,
        policy: SandboxPolicy,
        approvals: &str,
        prompts: Arc<dyn PromptBroker>,
    ) -> ToolContext {
        ToolContext {
            approvals: approvals.parse().expect("mode"),
            prompts,
            sandbox: Sandbox::new(policy, std::env::temp_dir()),
            ..ToolContext::detached(
                self.cwd.path().to_path_buf(),
                self.home.path().to_path_buf(),
                "sandbox-test",
            )
        }
    }

    fn ctx(&self, mode: SandboxMode) -> ToolContext {
        self.ctx_with(self.policy(mode, true), "manual", Arc::new(NoPrompts))
    }
}

async fn terminal(command: &str, ctx: &ToolContext) -> (Value, bool) {
    call(&TerminalTool, json!({"command": command}), ctx).await
}

fn output(result: &Value) -> &str {
    result["output"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn foreground_writes_go_only_under_the_roots_grandchildren_included_with_a_note() {
    let dirs = Dirs::new();
    let ctx = dirs.ctx(SandboxMode::WorkspaceWrite);
    let (result, is_error) = terminal("touch ok", &ctx).await;
    assert!(!is_error, "{result}");
    assert!(dirs.cwd.path().join("ok").exists());

    let probe = outside_path("probe");
    let touch = format!("touch {}", probe.display());
    for command in [touch.clone(), format!("sh -c 'sh -c \"{touch}\"'")] {
        let (result, is_error) = terminal(&command, &ctx).await;
        assert!(is_error, "{result}");
        assert!(output(&result).contains("Permission denied"), "{result}");
        let note = result["note"].as_str().expect("a note");
        assert!(note.contains("\"sandbox\": false"), "{note}");
        assert!(
            note.contains(&dirs.cwd.path().display().to_string()),
            "{note}"
        );
        assert!(!probe.exists());
    }
    // A failure that is not a refusal gets no note.
    let (result, _) = terminal("exit 3", &ctx).await;
    assert_eq!(result.get("note"), None, "{result}");
    // A refusal hidden in a list that exits 0 still gets one.
    let (result, _) = terminal(
        &format!("touch {}; true", outside_path("list").display()),
        &ctx,
    )
    .await;
    assert_eq!(result["exit_code"], 0, "{result}");
    assert!(result["note"].is_string(), "{result}");

    // Off, the same grandchild writes.
    let off = dirs.ctx(SandboxMode::Off);
    let (result, is_error) = terminal(&format!("sh -c 'sh -c \"{touch}\"'"), &off).await;
    assert!(!is_error, "{result}");
    assert!(probe.exists());
    std::fs::remove_file(&probe).expect("cleanup");
}

#[tokio::test]
async fn read_only_refuses_writes_in_the_cwd() {
    let dirs = Dirs::new();
    let ctx = dirs.ctx(SandboxMode::ReadOnly);
    let (result, is_error) = terminal("touch ok", &ctx).await;
    assert!(is_error, "{result}");
    assert!(!dirs.cwd.path().join("ok").exists());
    let (result, is_error) =
        terminal("ls / > /dev/null && cat /etc/hostname > /dev/null", &ctx).await;
    assert!(!is_error, "{result}");
}

#[tokio::test]
async fn background_commands_and_their_children_are_confined_and_still_report_their_exit() {
    let dirs = Dirs::new();
    let ctx = dirs.ctx(SandboxMode::WorkspaceWrite);
    let probe = outside_path("bg");
    let command = format!(
        "touch {p}; echo rc=$?; sh -c 'sh -c \"touch {p}\"'; echo grandchild=$?; \
         echo via-stdout >> /dev/stdout; ls -A {home}; touch ok; exit 7",
        p = probe.display(),
        home = dirs.home.path().display()
    );
    let (started, is_error) = call(
        &TerminalTool,
        json!({"command": command, "background": true}),
        &ctx,
    )
    .await;
    assert!(!is_error, "{started}");
    let id = started["process_id"].as_str().expect("id").to_string();
    let (waited, _) = call(
        &ProcessTool,
        json!({"action": "wait", "process_id": id, "timeout": 20}),
        &ctx,
    )
    .await;
    assert_eq!(waited["status"], "exited", "{waited}");
    assert_eq!(waited["exit_code"], 7, "{waited}");
    let (log, _) = call(
        &ProcessTool,
        json!({"action": "log", "process_id": id}),
        &ctx,
    )
    .await;
    let log = output(&log).to_string();
    assert!(log.contains("rc=1"), "{log}");
    assert!(log.contains("grandchild=1"), "{log}");
    assert!(
        log.contains("via-stdout"),
        "its own log stays writable: {log}"
    );
    assert!(!log.contains("daemon.json"), "the home is hidden: {log}");
    assert!(!probe.exists());
    assert!(dirs.cwd.path().join("ok").exists());

    // Off, the same background touch lands.
    let off = dirs.ctx(SandboxMode::Off);
    let (started, _) = call(
        &TerminalTool,
        json!({"command": format!("touch {}", probe.display()), "background": true}),
        &off,
    )
    .await;
    let id = started["process_id"].as_str().expect("id").to_string();
    let (waited, _) = call(
        &ProcessTool,
        json!({"action": "wait", "process_id": id, "timeout": 20}),
        &off,
    )
    .await;
    assert_eq!(waited["exit_code"], 0, "{waited}");
    assert!(probe.exists());
    std::fs::remove_file(&probe).expect("cleanup");
}

#[tokio::test]
async fn a_python_rmtree_outside_the_roots_leaves_the_directory_intact() {
    let dirs = Dirs::new();
    let victim = outside_path("victim");
    std::fs::create_dir_all(victim.join("sub")).expect("victim");
    std::fs::write(victim.join("sub/file"), "keep").expect("file");
    let command = format!(
        "/usr/bin/python3 -c 'import shutil; shutil.rmtree(\"{}\")'",
        victim.display()
    );
    // `auto` approvals: the approval check also names an rmtree, but here the sandbox alone
    // has to stop it.
    let ctx = |mode| dirs.ctx_with(dirs.policy(mode, true), "auto", Arc::new(NoPrompts));
    let (result, is_error) = terminal(&command, &ctx(SandboxMode::WorkspaceWrite)).await;
    assert!(is_error, "{result}");
    assert!(!result.to_string().contains("approval"), "{result}");
    assert_eq!(
        std::fs::read_to_string(victim.join("sub/file")).expect("kept"),
        "keep"
    );
    let (result, is_error) = terminal(&command, &ctx(SandboxMode::Off)).await;
    assert!(!is_error, "{result}");
    assert!(!victim.exists());
}

#[tokio::test]
async fn network_false_refuses_a_loopback_connect_and_true_allows_it() {
    let dirs = Dirs::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("addr").port();
    let command = format!(
        "/usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5); print(\"connected\")'"
    );
    let blocked = dirs.ctx_with(
        dirs.policy(SandboxMode::WorkspaceWrite, false),
        "manual",
        Arc::new(NoPrompts),
    );
    let (result, is_error) = terminal(&command, &blocked).await;
    assert!(is_error, "{result}");
    // The tool's own network namespace has nothing listening on its loopback.
    assert!(!output(&result).contains("connected"), "{result}");
    assert!(output(&result).contains("Connection refused"), "{result}");
    assert!(
        result["note"].as_str().expect("note").contains("network"),
        "{result}"
    );
    let (result, is_error) = terminal(&command, &dirs.ctx(SandboxMode::WorkspaceWrite)).await;
    assert!(!is_error, "{result}");
    assert!(output(&result).contains("connected"));
}

#[tokio::test]
async fn the_home_is_hidden_and_stays_hidden_even_outside_the_sandbox_and_after_umount() {
    let dirs = Dirs::new();
    let home = dirs.home.path().display();
    let command = format!(
        "ls -A {home}; cat {home}/daemon.json; umount {home} || umount -l {home} || echo \
         UMOUNT_REFUSED; cat {home}/daemon.json"
    );
    let ctx = dirs.ctx(SandboxMode::WorkspaceWrite);
    let (result, _) = terminal(&command, &ctx).await;
    assert!(!output(&result).contains("tok-31337"), "{result}");
    assert!(!output(&result).contains("daemon.json\n"), "{result}");
    assert!(output(&result).contains("UMOUNT_REFUSED"), "{result}");
    // Approved to run outside the sandbox: still no home.
    let escaped = dirs.ctx_with(
        dirs.policy(SandboxMode::WorkspaceWrite, true),
        "auto",
        Arc::new(NoPrompts),
    );
    let (result, _) = call(
        &TerminalTool,
        json!({"command": command, "sandbox": false}),
        &escaped,
    )
    .await;
    assert!(!output(&result).contains("tok-31337"), "{result}");
    assert!(output(&result).contains("UMOUNT_REFUSED"), "{result}");
    // Off: the home is right there.
    let (result, _) = terminal(
        &format!("cat {home}/daemon.json"),
        &dirs.ctx(SandboxMode::Off),
    )
    .await;
    assert!(output(&result).contains("tok-31337"), "{result}");
}

/// Set in the re-run of this test binary that carries planted variables.
const PLANTED: &str = "SANDBOX_TEST_PLANTED";

#[tokio::test]
async fn the_tool_env_has_no_planted_secret_and_no_drover_variable() {
    let planted = [
        ("DROVER_OWNER_PID", "4711999"),
        ("DROVER_DISPATCH_SECRET", "dispatch-planted"),
        ("OPENAI_API_KEY", "sk-planted"),
        ("GITHUB_TOKEN", "ghp-planted"),
        ("aws_secret_access_key", "aws-planted"),
        ("DB_PASSWORD", "pw-planted"),
        ("MY_CREDENTIALS", "cred-planted"),
        ("KEPT_TOKEN", "kept-value"),
    ];
    if std::env::var_os(PLANTED).is_none() {
        // Re-run just this test with the variables planted in the worker-side environment.
        let status = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args([
                "--exact",
                "the_tool_env_has_no_planted_secret_and_no_drover_variable",
                "--nocapture",
            ])
            .envs(planted)
            .env(PLANTED, "1")
            .status()
            .expect("re-run");
        assert!(status.success(), "the planted run failed");
        return;
    }
    let dirs = Dirs::new();
    for mode in [SandboxMode::WorkspaceWrite, SandboxMode::Off] {
        let mut policy = dirs.policy(mode, true);
        policy.env = ToolEnv {
            keep: vec!["KEPT_TOKEN".into()],
            set: [("SET_BY_CONFIG".to_string(), "set-value".to_string())].into(),
        };
        let ctx = dirs.ctx_with(policy, "manual", Arc::new(NoPrompts));
        let (result, is_error) = terminal("env", &ctx).await;
        assert!(!is_error, "{result}");
        let env = output(&result);
        for (name, value) in planted.iter().filter(|(n, _)| *n != "KEPT_TOKEN") {
            assert!(!env.contains(value), "{mode}: {name} leaked: {env}");
        }
        assert!(!env.contains("DROVER_"), "{mode}: {env}");
        assert!(env.contains("KEPT_TOKEN=kept-value"), "{mode}: {env}");
        assert!(env.contains("SET_BY_CONFIG=set-value"), "{mode}: {env}");
        assert!(env.contains("PATH="), "{mode}: {env}");
    }
}

#[tokio::test]
async fn sandbox_false_prompts_once_runs_unconfined_and_deny_refuses() {
    let dirs = Dirs::new();
    let probe = outside_path("escape");
    let command = format!("touch {}", probe.display());
    let args = json!({"command": command, "sandbox": false});

    // manual: a prompt whatever the command; `once` runs it without the write rules.
    let human = ScriptedPrompts::in_order(vec![PromptAnswer::Answered(json!("once"))]);
    let policy = dirs.policy(SandboxMode::WorkspaceWrite, true);
    let ctx = dirs.ctx_with(policy.clone(), "manual", human.clone());
    let (result, is_error) = call(&TerminalTool, args.clone(), &ctx).await;
    assert!(!is_error, "{result}");
    assert!(probe.exists());
    std::fs::remove_file(&probe).expect("cleanup");
    let seen = human.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "approval");
    assert_eq!(
        seen[0].1["command"],
        format!("run outside the sandbox: {command}")
    );
    assert_eq!(
        seen[0].1["pattern_key"],
        format!("sandbox_escape:{command}")
    );

    // A dangerous command outside the sandbox: one prompt naming both.
    let human = ScriptedPrompts::in_order(vec![PromptAnswer::Answered(json!("deny"))]);
    let ctx = dirs.ctx_with(policy.clone(), "manual", human.clone());
    let (result, is_error) = call(
        &TerminalTool,
        json!({"command": format!("rm -rf {}", probe.display()), "sandbox": false}),
        &ctx,
    )
    .await;
    assert!(is_error, "{result}");
    let seen = human.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let description = seen[0].1["description"].as_str().expect("description");
    assert!(description.contains("outside the sandbox") && description.contains("recursively"));

    // deny mode refuses without asking.
    let human = ScriptedPrompts::in_order(vec![]);
    let ctx = dirs.ctx_with(policy.clone(), "deny", human.clone());
    let (result, is_error) = call(&TerminalTool, args.clone(), &ctx).await;
    assert!(is_error, "{result}");
    assert!(result["error"]
        .as_str()
        .expect("error")
        .contains("approvals.mode = deny"));
    assert!(human.seen().is_empty());
    assert!(!probe.exists());

    // Unanswered (cancelled) is a no.
    let ctx = dirs.ctx_with(policy.clone(), "manual", Arc::new(NoPrompts));
    let (result, is_error) = call(&TerminalTool, args.clone(), &ctx).await;
    assert!(is_error, "{result}");
    assert!(!probe.exists());

    // A bad value names the field.
    let (result, is_error) = call(
        &TerminalTool,
        json!({"command": "true", "sandbox": "yes"}),
        &ctx,
    )
    .await;
    assert!(is_error);
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("\"sandbox\""),
        "{result}"
    );

    // Mode off: no prompt, it just runs.
    let human = ScriptedPrompts::in_order(vec![]);
    let ctx = dirs.ctx_with(dirs.policy(SandboxMode::Off, true), "manual", human.clone());
    let (result, is_error) = call(&TerminalTool, args, &ctx).await;
    assert!(!is_error, "{result}");
    assert!(human.seen().is_empty());
    std::fs::remove_file(&probe).expect("cleanup");
}

#[tokio::test]
async fn write_file_is_refused_outside_the_roots_and_in_the_home() {
    let dirs = Dirs::new();
    let ctx = dirs.ctx_with(
        dirs.policy(SandboxMode::WorkspaceWrite, true),
        "auto",
        Arc::new(NoPrompts),
    );
    let write = |path: PathBuf| json!({"path": path.display().to_string(), "content": "x"});
    let (result, is_error) =
        call(&WriteFileTool, write(dirs.cwd.path().join("a/b.txt")), &ctx).await;
    assert!(!is_error, "{result}");
    let target = outside_path("write");
    let (result, is_error) = call(&WriteFileTool, write(target.clone()), &ctx).await;
    assert!(is_error, "{result}");
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("writable roots"),
        "{result}"
    );
    assert!(!target.exists());
    // Through a symlink in the cwd to outside: judged by where it lands.
    std::os::unix::fs::symlink("/var/tmp", dirs.cwd.path().join("link")).expect("symlink");
    let (result, is_error) = call(
        &WriteFileTool,
        write(
            dirs.cwd
                .path()
                .join("link")
                .join(target.file_name().expect("name")),
        ),
        &ctx,
    )
    .await;
    assert!(is_error, "{result}");
    assert!(!target.exists());
    let (result, is_error) = call(
        &WriteFileTool,
        write(dirs.home.path().join("config.toml")),
        &ctx,
    )
    .await;
    assert!(is_error, "{result}");
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("drover home"),
        "{result}"
    );
    // Off (auto approvals): the same write goes through.
    let off = dirs.ctx_with(
        dirs.policy(SandboxMode::Off, true),
        "auto",
        Arc::new(NoPrompts),
    );
    let (result, is_error) = call(&WriteFileTool, write(target.clone()), &off).await;
    assert!(!is_error, "{result}");
    std::fs::remove_file(&target).expect("cleanup");
}

#[tokio::test]
async fn required_with_a_missing_layer_refuses_to_run() {
    let dirs = Dirs::new();
    let mut policy = dirs.policy(SandboxMode::WorkspaceWrite, true);
    policy.required = true;
    policy.support.landlock_abi = None;
    policy.support.problems = vec!["Landlock is not enabled".into()];
    let ctx = dirs.ctx_with(policy.clone(), "manual", Arc::new(NoPrompts));
    let (result, is_error) = terminal("touch ran", &ctx).await;
    assert!(is_error, "{result}");
    assert!(
        result["error"]
            .as_str()
            .expect("error")
            .contains("Landlock"),
        "{result}"
    );
    let (result, is_error) = call(
        &TerminalTool,
        json!({"command": "touch ran", "background": true}),
        &ctx,
    )
    .await;
    assert!(is_error, "{result}");
    assert!(!dirs.cwd.path().join("ran").exists());
    // Not required: it runs with what there is.
    policy.required = false;
    let ctx = dirs.ctx_with(policy, "manual", Arc::new(NoPrompts));
    let (result, is_error) = terminal("touch ran", &ctx).await;
    assert!(!is_error, "{result}");
    assert!(Path::new(&dirs.cwd.path().join("ran")).exists());
}

#[tokio::test]
async fn the_file_tools_cannot_read_the_home_directly_or_through_a_symlink() {
    use drover_tools::file::read::ReadFileTool;
    use drover_tools::file::search::SearchFilesTool;
    let dirs = Dirs::new();
    let ctx = dirs.ctx(SandboxMode::WorkspaceWrite);
    let daemon_json = dirs.home.path().join("daemon.json");
    std::os::unix::fs::symlink(&daemon_json, dirs.cwd.path().join("tok")).expect("symlink");
    std::os::unix::fs::symlink(dirs.home.path(), dirs.cwd.path().join("hl")).expect("symlink");
    for path in [
        daemon_json.display().to_string(),
        "tok".to_string(),
        "hl/daemon.json".to_string(),
    ] {
        let (result, is_error) = call(&ReadFileTool, json!({"path": path}), &ctx).await;
        assert!(is_error, "{path}: {result}");
        assert!(
            !result.to_string().contains("tok-31337"),
            "{path}: {result}"
        );
    }
    let (result, _) = call(
        &SearchFilesTool,
        json!({"pattern": "token", "path": dirs.home.path().display().to_string()}),
        &ctx,
    )
    .await;
    assert!(!result.to_string().contains("tok-31337"), "{result}");
    // The cwd searched with the symlinks in it: the home's file is passed over.
    let (result, _) = call(&SearchFilesTool, json!({"pattern": "tok-"}), &ctx).await;
    assert!(!result.to_string().contains("tok-31337"), "{result}");
    // With the sandbox off, the same read works: the refusal is the sandbox's.
    let (result, is_error) = call(
        &ReadFileTool,
        json!({"path": "tok"}),
        &dirs.ctx(SandboxMode::Off),
    )
    .await;
    assert!(
        !is_error && result.to_string().contains("tok-31337"),
        "{result}"
    );
}

#[tokio::test]
async fn the_file_tools_refuse_a_processs_environment_and_memory() {
    use drover_tools::file::read::ReadFileTool;
    let dirs = Dirs::new();
    let ctx = dirs.ctx(SandboxMode::WorkspaceWrite);
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .env("DROVER_TEST_KEY", "sk-test-31337")
        .spawn()
        .expect("sleep");
    let environ = format!("/proc/{}/environ", child.id());
    std::os::unix::fs::symlink(&environ, dirs.cwd.path().join("env")).expect("symlink");
    for (path, what) in [
        (environ.as_str(), "environment"),
        ("env", "environment"),
        ("/proc/self/environ", "environment"),
        ("/proc/thread-self/environ", "environment"),
        ("/proc/self/mem", "memory"),
    ] {
        let (result, is_error) = call(&ReadFileTool, json!({"path": path}), &ctx).await;
        assert!(is_error, "{path}: {result}");
        assert!(
            result
                .to_string()
                .contains(&format!("is a process's {what}")),
            "{path}: {result}"
        );
    }
    // Other /proc files stay readable.
    let (result, is_error) = call(&ReadFileTool, json!({"path": "/proc/self/status"}), &ctx).await;
    assert!(!is_error, "{result}");
    child.kill().expect("kill");
    child.wait().expect("reap");
}

/// Answers every approval `once`, after swapping the directory `dir` for a symlink to
/// `target`: what a background process could do while the human reads the prompt.
struct SwapThenOnce {
    dir: PathBuf,
    target: PathBuf,
}

#[async_trait::async_trait]
impl PromptBroker for SwapThenOnce {
    async fn open(&self, _kind: &str, _body: Value) -> PromptAnswer {
        std::fs::rename(&self.dir, self.dir.with_extension("moved")).expect("move");
        std::os::unix::fs::symlink(&self.target, &self.dir).expect("swap");
        PromptAnswer::Answered(json!("once"))
    }
}

#[tokio::test]
async fn a_write_approved_before_a_symlink_swap_does_not_land_in_the_home() {
    let dirs = Dirs::new();
    // Outside the cwd (so the write asks), inside the temp dir (so the sandbox allows it).
    let scratch = tempfile::tempdir().expect("scratch");
    let dir = scratch.path().join("d");
    std::fs::create_dir(&dir).expect("dir");
    let broker = Arc::new(SwapThenOnce {
        dir: dir.clone(),
        target: dirs.home.path().to_path_buf(),
    });
    let ctx = dirs.ctx_with(
        dirs.policy(SandboxMode::WorkspaceWrite, true),
        "manual",
        broker,
    );
    let (result, is_error) = call(
        &WriteFileTool,
        json!({"path": dir.join("daemon.json").display().to_string(), "content": "pwned"}),
        &ctx,
    )
    .await;
    assert!(is_error, "the swapped write went through: {result}");
    let kept = std::fs::read_to_string(dirs.home.path().join("daemon.json")).expect("read");
    assert!(
        kept.contains("tok-31337"),
        "the home's file was replaced: {kept}"
    );
}

#[tokio::test]
async fn an_exec_job_asks_first_under_a_sandbox_whatever_its_command_and_mode() {
    use drover_tools::jobs::JobSubmitTool;
    let dirs = Dirs::new();
    let probe = outside_path("exec-job");
    let command = format!(
        "cat {}/daemon.json; touch {}",
        dirs.home.path().display(),
        probe.display()
    );
    let args = json!({"agent_session": "exec", "prompt": "x", "exec": command});
    // `auto` trusts the sandbox, and an exec job has none: it asks there too.
    for mode in ["manual", "auto"] {
        let human = ScriptedPrompts::in_order(vec![PromptAnswer::Answered(json!("deny"))]);
        let ctx = dirs.ctx_with(
            dirs.policy(SandboxMode::WorkspaceWrite, true),
            mode,
            human.clone(),
        );
        let (result, is_error) = call(&JobSubmitTool, args.clone(), &ctx).await;
        assert!(is_error, "{mode}: {result}");
        assert!(
            !probe.exists(),
            "{mode}: the exec job ran without the human"
        );
        let seen = human.seen();
        assert_eq!(seen.len(), 1, "{mode}: {seen:?}");
        assert_eq!(
            seen[0].1["command"],
            format!("run unconfined (exec job, no sandbox): {command}")
        );
        let description = seen[0].1["description"].as_str().unwrap_or_default();
        assert!(
            description.contains("UNCONFINED") && description.contains("token"),
            "{description}"
        );
    }
    // In deny mode it is refused without a prompt.
    let ctx = dirs.ctx_with(
        dirs.policy(SandboxMode::WorkspaceWrite, true),
        "deny",
        Arc::new(NoPrompts),
    );
    let (result, is_error) = call(&JobSubmitTool, args, &ctx).await;
    assert!(is_error, "{result}");
    assert!(!probe.exists());
}
