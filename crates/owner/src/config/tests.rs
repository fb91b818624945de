//! The config file's defaults, its refusals naming the key, and the environment it reads.

use super::*;

#[test]
fn missing_file_gives_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.approvals.mode, ApprovalMode::Manual);
    assert_eq!(c.model.settings(), ModelSettings::default());
    assert_eq!(c.model.max_steps, 50);
    assert_eq!(c.model.api_key_env, "OPENAI_API_KEY");
    assert_eq!(c.delegation.max_concurrent_children, 2);
    assert_eq!(c.daemon.listen, "127.0.0.1:0");
}

#[test]
fn jobs_dispatch_max_age_defaults_to_a_day_and_is_read() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        Config::load(dir.path()).unwrap().jobs.dispatch_max_age_s,
        86_400
    );
    let file = dir.path().join("config.toml");
    std::fs::write(&file, "[jobs]\ndispatch_max_age_s = 600\n").unwrap();
    assert_eq!(
        Config::load(dir.path()).unwrap().jobs.dispatch_max_age_s,
        600
    );
    std::fs::write(&file, "[jobs]\ndispatch_max_age = 600\n").unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("dispatch_max_age"), "{e}");
    std::fs::write(&file, "[jobs]\ndispatch_max_age_s = -1\n").unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("dispatch_max_age_s"), "{e}");
}

#[test]
fn bad_mode_and_unknown_keys_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[approvals]\nmode = \"yolo\"\n",
    )
    .unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.toml"), "{e}");
    assert!(
        e.contains(r#"invalid approvals.mode "yolo" (expected one of: manual, auto, deny)"#),
        "{e}"
    );
    std::fs::write(dir.path().join("config.toml"), "[approvals]\nmode = 1\n").unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("mode"), "{e}");
    std::fs::write(dir.path().join("config.toml"), "[model]\nnmae = \"x\"\n").unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("nmae"), "{e}");
}

#[test]
fn listen_beyond_loopback_needs_allow_remote_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let load = |daemon: &str| {
        std::fs::write(
            dir.path().join("config.toml"),
            format!("[daemon]\n{daemon}\n"),
        )
        .unwrap();
        Config::load(dir.path()).map_err(|e| e.to_string())
    };
    for ok in ["127.0.0.1:0", "[::1]:7000", "localhost:7000", "127.0.0.2:0"] {
        load(&format!("listen = {ok:?}")).unwrap();
    }
    let e = load("listen = \"0.0.0.0:0\"").unwrap_err();
    assert!(
        e.contains("[daemon] listen") && e.contains("allow_remote"),
        "{e}"
    );
    let e = load("listen = \"0.0.0.0:0\"\nallow_remote = true").unwrap_err();
    assert!(e.contains("tls_cert") && e.contains("tls_key"), "{e}");
    let e = load("tls_cert = \"/c.pem\"").unwrap_err();
    assert!(e.contains("tls_key"), "{e}");
    let c = load(
        "listen = \"0.0.0.0:0\"\nallow_remote = true\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"",
    )
    .unwrap();
    assert_eq!(c.daemon.tls().unwrap().0, Path::new("/c.pem"));
    // Loopback may have allow_remote without TLS: nothing leaves the host.
    load("allow_remote = true").unwrap();
}

#[test]
fn every_approval_mode_is_read_by_its_lowercase_word() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ApprovalMode::ALL {
        std::fs::write(
            dir.path().join("config.toml"),
            format!("[approvals]\nmode = \"{mode}\"\n"),
        )
        .unwrap();
        assert_eq!(Config::load(dir.path()).unwrap().approvals.mode, mode);
    }
}

#[test]
fn a_sessions_mode_wins_unless_the_home_says_deny() {
    use ApprovalMode::{Auto, Deny, Manual};
    for (home, session, want) in [
        (Manual, None, Manual),
        (Auto, None, Auto),
        (Deny, None, Deny),
        (Manual, Some(Auto), Auto),
        (Manual, Some(Deny), Deny),
        (Auto, Some(Manual), Manual),
        (Auto, Some(Deny), Deny),
        (Deny, Some(Auto), Deny),
        (Deny, Some(Manual), Deny),
    ] {
        let section = ApprovalsSection { mode: home };
        assert_eq!(section.mode_for(session), want, "{home} {session:?}");
    }
}

#[test]
fn model_keys_left_out_keep_the_model_settings_defaults() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), "[model]\nmax_retries = 0\n").unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(
        c.model.settings(),
        ModelSettings {
            max_retries: 0,
            ..ModelSettings::default()
        }
    );
    assert_eq!(c.model.max_steps, 50);
}

#[test]
fn counted_keys_default_are_read_and_zero_is_refused() {
    type Read = fn(&Config) -> u64;
    let keys: [(&str, u64, Read); 3] = [
        ("max_input_bytes", 1 << 20, |c| c.daemon.max_input_bytes),
        ("worker_logs_keep", 1000, |c| c.daemon.worker_logs_keep),
        ("max_steps", 50, |c| u64::from(c.model.max_steps)),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    for (key, default, read) in keys {
        let section = if key == "max_steps" {
            "model"
        } else {
            "daemon"
        };
        let _ = std::fs::remove_file(&file);
        assert_eq!(read(&Config::load(dir.path()).unwrap()), default, "{key}");
        std::fs::write(&file, format!("[{section}]\n{key} = 10\n")).unwrap();
        assert_eq!(read(&Config::load(dir.path()).unwrap()), 10, "{key}");
        std::fs::write(&file, format!("[{section}]\n{key} = 0\n")).unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("{key} = 0")), "{e}");
    }
}

#[test]
fn liveness_keys_default_and_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.model.stall_timeout_s, 120);
    assert_eq!(c.model.settings().stall_timeout_s, 120);
    assert_eq!(c.daemon.progress_interval_s, 5.0);
    assert_eq!(
        c.daemon.progress_interval(),
        std::time::Duration::from_secs(5)
    );
    std::fs::write(
        &file,
        "[model]\nstall_timeout_s = 2\n\n[daemon]\nprogress_interval_s = 0.25\n\n\
         [mcp_servers.slow]\ncommand = \"srv\"\ntool_timeout_s = 3\n\n\
         [mcp_servers.plain]\ncommand = \"srv\"\n",
    )
    .unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.model.settings().stall_timeout_s, 2);
    assert_eq!(
        c.daemon.progress_interval(),
        std::time::Duration::from_millis(250)
    );
    let specs = c.mcp_servers_of(&["slow".into(), "plain".into()]);
    assert_eq!(specs.get("slow").map(|s| s.tool_timeout_s), Some(3));
    assert_eq!(specs.get("plain").map(|s| s.tool_timeout_s), Some(600));
    for bad in ["0", "-1", "nan", "inf", "86401"] {
        std::fs::write(&file, format!("[daemon]\nprogress_interval_s = {bad}\n")).unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("progress_interval_s"), "{bad}: {e}");
    }
    std::fs::write(&file, "[model]\nstall_timeout_s = -1\n").unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("stall_timeout_s"), "{e}");
    std::fs::write(
        &file,
        "[mcp_servers.x]\ncommand = \"s\"\ntool_timeout = 3\n",
    )
    .unwrap();
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tool_timeout"), "{e}");
}

#[test]
fn idle_exit_defaults_to_900_s_and_must_be_above_0() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.daemon.idle_exit(), std::time::Duration::from_secs(900));
    std::fs::write(&file, "[daemon]\nidle_exit_s = 1.5\n").unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.daemon.idle_exit(), std::time::Duration::from_millis(1500));
    for bad in ["0", "-1", "nan", "inf"] {
        std::fs::write(&file, format!("[daemon]\nidle_exit_s = {bad}\n")).unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("idle_exit_s"), "{bad}: {e}");
    }
}

#[test]
fn file_values_are_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[model]\nbase_url = \"http://127.0.0.1:1/v1\"\nname = \"m\"\nstream = false\n",
    )
    .unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.base_url().as_deref(), Some("http://127.0.0.1:1/v1"));
    assert_eq!(c.model.name.as_deref(), Some("m"));
    assert!(!c.model.stream);
}

#[test]
fn sandbox_defaults_and_values_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.sandbox.mode, SandboxMode::WorkspaceWrite);
    assert!(c.sandbox.network && !c.sandbox.required);
    assert_eq!(c.sandbox.frozen(), SessionSandbox::default());
    let root = dir.path().display().to_string();
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "[sandbox]\nmode = \"read-only\"\nwritable_roots = [{root:?}]\nnetwork = false\n\
             required = true\n\n[sandbox.env]\nkeep = [\"GH_TOKEN\"]\n\
             set = {{ DEPLOY_KEY = \"hunter2\" }}\n"
        ),
    )
    .unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(
        c.sandbox.frozen(),
        SessionSandbox {
            mode: SandboxMode::ReadOnly,
            writable_roots: vec![root],
            network: false,
            required: true,
        }
    );
    let env = c.sandbox.tool_env();
    assert_eq!(env.keep, vec!["GH_TOKEN".to_string()]);
    assert_eq!(
        env.set.get("DEPLOY_KEY").map(String::as_str),
        Some("hunter2")
    );
    // The config prints no value of [sandbox.env] set, nor the policy's.
    assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
    assert!(!format!("{env:?}").contains("hunter2"), "{env:?}");
}

#[test]
fn bad_sandbox_values_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    let load = |text: String| {
        std::fs::write(&file, text).unwrap();
        Config::load(dir.path()).unwrap_err().to_string()
    };
    let e = load("[sandbox]\nmode = \"yes\"\n".into());
    assert!(e.contains("sandbox.mode") && e.contains("yes"), "{e}");
    let e = load("[sandbox]\nwritable_roots = [\"relative/dir\"]\n".into());
    assert!(
        e.contains("sandbox.writable_roots") && e.contains("absolute"),
        "{e}"
    );
    let missing = dir.path().join("no-such-dir").display().to_string();
    let e = load(format!("[sandbox]\nwritable_roots = [{missing:?}]\n"));
    assert!(
        e.contains("sandbox.writable_roots") && e.contains("no-such-dir"),
        "{e}"
    );
    let e = load("[sandbox]\nnetwork = \"no\"\n".into());
    assert!(e.contains("network"), "{e}");
    let e = load("[sandbox]\nmodes = \"off\"\n".into());
    assert!(e.contains("modes"), "{e}");
    let e = load("[sandbox.env]\nset = { \"A=B\" = \"x\" }\n".into());
    assert!(e.contains("sandbox.env.set"), "{e}");
    let e = load("[sandbox.env]\nkeeps = []\n".into());
    assert!(e.contains("keeps"), "{e}");
}

#[test]
fn mcp_env_values_and_the_api_key_print_redacted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[mcp_servers.gh]\ncommand = \"srv\"\nenv = { GITHUB_TOKEN = \"ghp-secret\" }\n",
    )
    .unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert!(!format!("{c:?}").contains("ghp-secret"));
    let specs = c.mcp_servers_of(&["gh".into()]);
    assert!(!format!("{specs:?}").contains("ghp-secret"));
    assert_eq!(
        specs["gh"].env.get("GITHUB_TOKEN").map(Secret::expose),
        Some("ghp-secret")
    );
}

/// `[agents.<name>]`: read with its defaults, refused naming the key when it cannot start an
/// agent, and resolved for a turn with `KEY_env` entries read from the daemon's environment
/// (an unset one left out).
#[test]
fn agents_are_read_checked_and_resolved_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        "[agents.codex]\ncommand = [\"codex-acp\", \"-c\", \"x=1\"]\n\
         env = { CODEX_HOME = \"/c\", SEARCH_PATH_env = \"PATH\", \
         GONE_env = \"DROVER_TEST_SURELY_UNSET_VARIABLE\" }\n",
    )
    .unwrap();
    let config = Config::load(dir.path()).unwrap();
    let entry = &config.agents["codex"];
    assert!(entry.sandbox);
    assert_eq!(entry.stall_timeout_s, 300);
    let agent = entry.resolve("codex", 2.5, Some("a-1".into()));
    assert_eq!(agent.command, ["codex-acp", "-c", "x=1"]);
    assert_eq!(agent.env["CODEX_HOME"].expose(), "/c");
    assert_eq!(
        agent.env["SEARCH_PATH"].expose(),
        std::env::var("PATH").unwrap()
    );
    assert!(!agent.env.contains_key("GONE"));
    assert!(!agent.env.contains_key("GONE_env"));
    assert_eq!(agent.agent_session_id.as_deref(), Some("a-1"));
    assert_eq!(agent.interrupt_grace_s, 2.5);
    for (text, key) in [
        ("[agents.a]\ncommand = []\n", "[agents.a] command"),
        (
            "[agents.a]\ncommand = [\"x\"]\nstall_timeout_s = 0\n",
            "stall_timeout_s",
        ),
        ("[agents.a]\ncommand = [\"x\"]\ncwd = \"/\"\n", "cwd"),
    ] {
        std::fs::write(&file, text).unwrap();
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}
