// drover's web dashboard. A plain ES module: it speaks the same JSON-RPC 2.0 over
// `/v1/ws` as every other client (docs/protocol.md), logged in by the credential `/ui/login`
// hands over in the URL's fragment (kept in this origin's storage, offered as a subprotocol).
// Views: sessions, one session, jobs, one job, background processes, MCP servers.

import { escapeHtml, renderMarkdown } from "./markdown.js";

// ---------------------------------------------------------------------------------------------
// Small DOM helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "html") el.innerHTML = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function now() {
  return Date.now() / 1000;
}

function ago(at) {
  if (at === undefined || at === null) return "never";
  const s = Math.max(0, Math.floor(now() - at));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

function seconds(s) {
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function short(id) {
  return String(id).slice(0, 8);
}

function newId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

function errorText(e) {
  if (!e) return "unknown error";
  const detail = e.data && e.data.detail;
  return detail || e.message || String(e);
}

function showError(e) {
  const banner = document.getElementById("banner");
  banner.hidden = false;
  banner.className = "banner bad";
  banner.textContent = errorText(e);
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => {
    if (banner.textContent === errorText(e)) banner.hidden = true;
  }, 8000);
}

function showBanner(text, bad = false) {
  const banner = document.getElementById("banner");
  banner.hidden = false;
  banner.className = bad ? "banner bad" : "banner";
  banner.textContent = text;
}

// ---------------------------------------------------------------------------------------------
// The connection: JSON-RPC over the daemon's WebSocket, reconnecting on its own.
//
// A handoff (`drover restart`): the old owner sends `daemon.restarted` and closes with 1012; the
// next owner serves on the same address, so the page reconnects at once, says "daemon restarted
// (version X -> Y)" in its banner, and each view catches up from its last `seq`.

// The close code of a handoff ("service restart").
const RESTART_CLOSE_CODE = 1012;

// The versions of a handoff close's reason, "the daemon restarted (version X -> Y)".
function restartFromReason(reason) {
  const m = /\(version (\S+) -> (\S+)\)/.exec(reason || "");
  return { from_version: m ? m[1] : "", to_version: m ? m[2] : "", epoch: 0 };
}

class Connection {
  constructor() {
    this.ws = null;
    this.nextId = 1;
    this.waiting = new Map();
    this.listeners = new Set();
    this.connected = false;
    this.held = false;
    this.retryMs = 500;
    // The `daemon.restarted` notice of the last handoff, until the next owner answered.
    this.restart = null;
    this.onOpen = () => {};
    this.onRefused = () => {};
  }

  url() {
    return `${location.origin.replace(/^http/, "ws")}/v1/ws`;
  }

  // The login credential rides as a subprotocol: a browser's WebSocket can set no header.
  protocols() {
    const credential = localStorage.getItem(LOGIN_KEY);
    return credential ? ["drover.v1", `drover-auth.${credential}`] : ["drover.v1"];
  }

  open() {
    if (this.held) return;
    setConn("connecting");
    const ws = new WebSocket(this.url(), this.protocols());
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.connected = true;
      this.retryMs = 500;
      setConn("connected");
      this.onOpen();
    };
    ws.onmessage = (m) => this.receive(m.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      if (ev.code === RESTART_CLOSE_CODE && !this.restart) {
        this.restart = restartFromReason(ev.reason);
      }
      this.connected = false;
      for (const w of this.waiting.values()) {
        w.reject({ message: "the connection closed", data: { reason: "disconnected" } });
      }
      this.waiting.clear();
      setConn("disconnected");
      if (!opened) this.onRefused();
      // A connection the old owner of a handoff closed: its next owner serves already, so
      // no backoff. (One the next owner refused said why in `onRefused`.)
      const handedOver = Boolean(this.restart) && opened;
      if (handedOver) {
        setConn("restarting");
        showBanner(restartText(this.restart, "reconnecting…"));
      }
      if (!this.held) {
        setTimeout(() => this.open(), handedOver ? 50 : this.retryMs);
        if (!handedOver) this.retryMs = Math.min(this.retryMs * 2, 5000);
      }
    };
  }

  receive(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch {
      return;
    }
    if (msg.id !== undefined && msg.id !== null && this.waiting.has(msg.id)) {
      const w = this.waiting.get(msg.id);
      this.waiting.delete(msg.id);
      if (msg.error) w.reject(msg.error);
      else w.resolve(msg.result);
      return;
    }
    if (msg.method === "daemon.restarted" && msg.params) {
      this.restart = msg.params;
      return;
    }
    if (msg.method === "event" && msg.params) {
      for (const l of this.listeners) l(msg.params);
    }
  }

  call(method, params = {}) {
    return new Promise((resolve, reject) => {
      if (!this.connected || !this.ws) {
        reject({ message: "not connected", data: { reason: "disconnected" } });
        return;
      }
      const id = this.nextId++;
      this.waiting.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
  }

  // Drops the socket and stays away until `release` (for trying the reconnect path).
  hold() {
    this.held = true;
    if (this.ws) this.ws.close();
  }

  release() {
    this.held = false;
    this.open();
  }
}

const rpc = new Connection();

function restartText(r, tail = "") {
  const versions = r.from_version || r.to_version ? ` (version ${r.from_version} -> ${r.to_version})` : "";
  return `daemon restarted${versions}${tail ? `; ${tail}` : ""}`;
}

function setConn(state) {
  const el = document.getElementById("conn");
  el.className = `conn conn-${state}`;
  el.textContent = state;
  document.body.dataset.conn = state;
}

// ---------------------------------------------------------------------------------------------
// The daemon: which start answers, and whether it changed.

const EPOCH_KEY = "drover.dashboard.epoch";
let daemon = null;

async function learnDaemon() {
  const info = await rpc.call("daemon.info");
  const restart = rpc.restart;
  const seen = daemon ? daemon.epoch : Number(sessionStorage.getItem(EPOCH_KEY) || 0);
  // The old owner of a handoff, still answering on the address it shares until it exits:
  // not the daemon to follow.
  if (restart && info.epoch <= seen && info.epoch < restart.epoch) {
    throw { message: "the next daemon is not serving yet", data: { reason: "disconnected" } };
  }
  rpc.restart = null;
  daemon = info;
  sessionStorage.setItem(EPOCH_KEY, String(info.epoch));
  const el = document.getElementById("daemon");
  el.textContent = `epoch ${info.epoch} · pid ${info.pid}`;
  el.dataset.epoch = String(info.epoch);
  if (restart) {
    // A handoff: running turns carry on; the views catch up from their last `seq`.
    showBanner(restartText(restart));
  } else if (seen && seen !== info.epoch) {
    showBanner(`The daemon restarted: epoch ${seen} → ${info.epoch}.`);
  } else {
    document.getElementById("banner").hidden = true;
  }
}

// An upgrade that never opened: the daemon is down, restarted (its logins died with the old
// start), or this browser is not logged in. /healthz (no login) tells which.
async function explainRefusal() {
  let health = null;
  try {
    const r = await fetch("/healthz", { cache: "no-store" });
    health = await r.json();
  } catch {
    showBanner("The daemon is not reachable; retrying…", true);
    return;
  }
  if (daemon && health.epoch !== undefined && health.epoch !== daemon.epoch) {
    const el = document.getElementById("daemon");
    el.textContent = `epoch ${health.epoch} (restarted)`;
    el.dataset.epoch = String(health.epoch);
    showBanner(
      `The daemon restarted: epoch ${daemon.epoch} → ${health.epoch}. ` +
        "Logins end with the daemon start that made them: run `drover ui` for a new link.",
      true,
    );
    return;
  }
  showBanner("Not logged in (or the login ended): run `drover ui` for a login link.", true);
}

// ---------------------------------------------------------------------------------------------
// Views. Each has `root` (an element), `connected()` (called on every (re)connection), `event(e)`
// and `dispose()`.

const STATE_WORDS = {
  idle: "idle",
  running: "running",
  waiting_approval: "waiting for approval",
  waiting_clarify: "waiting for an answer",
  paused_unknown: "paused on unknown",
};

function badge(kind, word, text) {
  return h("span", { class: `badge ${kind}-${word}`, "data-state": word }, text ?? word);
}

class Poller {
  constructor(fn, ms) {
    this.fn = fn;
    this.ms = ms;
    this.busy = false;
    this.timer = setInterval(() => this.tick(), ms);
  }

  async tick() {
    if (this.busy || !rpc.connected) return;
    this.busy = true;
    try {
      await this.fn();
    } catch (e) {
      if (!(e && e.data && e.data.reason === "disconnected")) showError(e);
    } finally {
      this.busy = false;
    }
  }

  stop() {
    clearInterval(this.timer);
  }
}

// A view that reads what it shows with `refresh`, every `ms` and once on each (re)connect; it
// takes no pushed events.
class PolledView {
  constructor(ms) {
    this.poller = new Poller(() => this.refresh(), ms);
  }

  connected() {
    return this.poller.tick();
  }

  event() {}

  dispose() {
    this.poller.stop();
  }
}

// A table with a header row of `headings`, then `body`.
function table(headings, body) {
  return h("table", {}, h("thead", {}, h("tr", {}, headings.map((t) => h("th", {}, t)))), body);
}

// Every session of the home, newest first: `session.list` page after page (a session waiting
// for an answer may be far down the list). At most 20,000, so a page never polls forever.
// The agent a session's turns run: an external agent's name (`[agents.<name>]`), or drover's
// own agent loop.
function agentName(agent) {
  return agent || "drover";
}

// A spend's cost in USD as a person reads it (`usage.report`): "" when none is known, a `*`
// when some turns had no price.
function costText(spend) {
  if (!spend || spend.cost_usd === null || spend.cost_usd === undefined) return "";
  const c = spend.cost_usd;
  const usd = c === 0 ? "0" : c >= 1 ? c.toFixed(2) : c >= 0.01 ? c.toFixed(4) : c.toFixed(6);
  return `$${usd}${spend.unpriced_executions ? "*" : ""}`;
}

async function allSessions() {
  const sessions = [];
  let cursor = null;
  do {
    const params = cursor ? { limit: 200, cursor } : { limit: 200 };
    const page = await rpc.call("session.list", params);
    sessions.push(...page.sessions);
    cursor = page.next_cursor;
  } while (cursor && sessions.length < 20000);
  return sessions;
}

class SessionsView extends PolledView {
  constructor() {
    super(2000);
    this.table = h("tbody");
    this.root = h(
      "section",
      { id: "sessions" },
      h("h1", {}, "Sessions"),
      table(["Title", "Agent", "Source", "Model", "State", "Queue", "Last activity", "Tokens"], this.table),
    );
  }

  // Each session's spend (`usage.report` by session): read at most once a minute, as it reads
  // every turn of the home on the ledger's thread (about 0.15 s for 100,000 turns).
  async sessionSpend() {
    if (!this.spend || now() - this.spendAt > 60) {
      const report = await rpc.call("usage.report", { by: "session" }).catch(() => null);
      this.spend = new Map((report ? report.groups : []).map((g) => [g.key, g]));
      this.spendAt = now();
    }
    return this.spend;
  }

  async refresh() {
    const page = { sessions: await allSessions() };
    const spend = await this.sessionSpend();
    this.table.replaceChildren();
    if (!page.sessions.length) {
      this.table.append(
        h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No sessions yet: start one with `drover run` or `drover chat`.")),
      );
    }
    for (const s of page.sessions) {
      const tokens =
        s.input_tokens !== undefined
          ? `${(s.input_tokens + s.output_tokens).toLocaleString()} (${s.input_tokens.toLocaleString()} in / ${s.output_tokens.toLocaleString()} out)`
          : "";
      const cost = costText(spend.get(s.session_id));
      this.table.append(
        h(
          "tr",
          { "data-session": s.session_id },
          h(
            "td",
            {},
            h("a", { href: `#/session/${s.session_id}` }, s.title || `session ${short(s.session_id)}`),
            s.error ? h("div", { class: "error-text" }, s.error) : null,
          ),
          h("td", { class: "agent" }, agentName(s.agent)),
          h("td", {}, s.source),
          h("td", { class: "mono" }, s.model),
          h("td", {}, badge("state", s.state, STATE_WORDS[s.state] || s.state)),
          h("td", { class: "num" }, String(s.pending_count)),
          h("td", {}, ago(s.last_activity_at)),
          h("td", { class: "num" }, tokens, cost ? h("div", { class: "cost" }, cost) : null),
        ),
      );
    }
  }
}

const CHOICE_WORDS = {
  once: "Allow once",
  session: "Allow for this session",
  always: "Always allow…",
  deny: "Deny",
};

// Where an `always` rule applies, as the approvals list names it.
const SCOPE_WORDS = {
  directory: "this directory tree",
  workspace: "this workspace",
  everywhere: "everywhere",
};

// The scopes an `always` answer may take, each with the words every surface shows: the
// prompt's offers, or, for a prompt stored before rules had scopes, `everywhere` only (what
// the daemon stores for it; sent with no `scope`).
function alwaysOffers(p) {
  if (p.scopes && p.scopes.length) return p.scopes;
  const what = p.class || (p.description || "").split(":")[0].trim() || p.pattern_key.replaceAll("_", " ");
  return [
    {
      scope: "everywhere",
      text: `every command that ${what}, anywhere, in every session of this home (everywhere)`,
      implied: true,
    },
  ];
}

// The offer a confirmation starts on: the workspace, else the narrowest.
function defaultOffer(offers) {
  const workspace = offers.find((o) => o.scope === "workspace");
  return (workspace || offers[0]).scope;
}

// How a tool call's approval prompt was answered (`approval.settled`), as a person reads it.
const APPROVAL_WORDS = {
  once: "approved once",
  session: "approved for this session",
  always: "always approved",
  deny: "denied",
  cancelled: "approval closed unanswered",
};

// How a turn ended (`turn.settled` `outcome`), as a person reads it.
const OUTCOME_WORDS = {
  completed: "completed",
  interrupted: "interrupted",
  failed: "failed",
  rejected: "rejected",
  cancelled: "cancelled",
  unknown: "unknown (its worker or the daemon was lost)",
};

// Why a tool call has no result: how its turn ended.
const ENDED_WORDS = {
  interrupted: "no result: the turn was interrupted",
  failed: "no result: the turn failed",
  unknown: "no result: the turn was lost (unknown)",
  cancelled: "no result: the turn was cancelled",
};

// A tool call as a block that opens on its arguments and result. `opts.running`: it has no
// result yet and its turn runs; `opts.ended`: it has none and its turn ended without one (the
// outcome's word); `opts.approval`: how its approval prompt was answered.
function toolBlock(name, args, result, isError, opts = {}) {
  let argsText = args;
  if (typeof args === "string") {
    try {
      argsText = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      argsText = args;
    }
  } else if (args !== undefined) {
    argsText = JSON.stringify(args, null, 2);
  }
  const preview = (() => {
    try {
      const a = typeof args === "string" ? JSON.parse(args) : args;
      return a && (a.command || a.path || a.text || "");
    } catch {
      return "";
    }
  })();
  const resultText =
    result === undefined || result === null
      ? null
      : typeof result === "string"
        ? result
        : JSON.stringify(result, null, 2);
  return h(
    "details",
    {
      class: `tool${isError ? " error" : ""}`,
      "data-tool": name,
      "data-tool-id": opts.toolId,
      "data-running": opts.running ? "true" : undefined,
      "data-ended": opts.ended,
      "data-approval": opts.approval,
    },
    h(
      "summary",
      {},
      h("span", { class: "name" }, name),
      preview ? h("span", { class: "mono muted" }, `  ${String(preview).slice(0, 80)}`) : null,
      opts.approval
        ? h("span", { class: `approval approval-${opts.approval}` }, `  · ${APPROVAL_WORDS[opts.approval] || opts.approval}`)
        : null,
      opts.running ? h("span", { class: "muted" }, "  · running…") : null,
      opts.ended ? h("span", { class: "ended" }, `  · ${ENDED_WORDS[opts.ended] || "no result"}`) : null,
      isError ? h("span", {}, "  · error") : null,
    ),
    h(
      "div",
      { class: "inner" },
      h("div", { class: "label" }, "Arguments"),
      h("pre", {}, argsText ?? ""),
      resultText !== null ? h("div", { class: "label" }, "Result") : null,
      resultText !== null ? h("pre", { class: "result" }, resultText) : null,
    ),
  );
}

// What the session's stored event stream says happened, which its snapshot does not: each
// turn's outcome and error, each tool call's turn and approval answer. Built from `seq` 1 on
// (`session.events.since`) and kept up with the events as they come, strictly in `seq` order.
class TurnHistory {
  constructor() {
    this.epoch = null;
    this.upTo = 0;
    this.turns = new Map();
    this.order = [];
    this.tools = new Map();
    this.promptTool = new Map();
    this.running = null;
    this.open = [];
  }

  // Takes the stored event `e` if it is the next one; gives whether it did.
  take(e) {
    if (e.replay_epoch !== this.epoch || e.seq !== this.upTo + 1) return false;
    this.upTo = e.seq;
    const p = e.payload || {};
    switch (e.type) {
      case "turn.started":
        this.running = p.admission_id;
        this.open = [];
        if (!this.turns.has(p.admission_id)) this.order.push(p.admission_id);
        this.turns.set(p.admission_id, {
          admission_id: p.admission_id,
          generation: p.execution_generation,
          outcome: null,
          error: null,
          resolved: null,
        });
        break;
      case "tool.start":
        this.tools.set(p.tool_id, { turn: this.running, approval: null, is_error: false });
        this.open.push(p.tool_id);
        break;
      case "tool.complete": {
        const t = this.tools.get(p.tool_id);
        if (t) t.is_error = Boolean(p.is_error);
        this.open = this.open.filter((id) => id !== p.tool_id);
        break;
      }
      case "approval.request":
        // Tool calls run one after another: the prompt is the newest open call's.
        if (this.open.length) this.promptTool.set(p.prompt_id, this.open[this.open.length - 1]);
        break;
      case "approval.settled": {
        const t = this.tools.get(this.promptTool.get(p.prompt_id));
        if (t) t.approval = p.status === "resolved" && p.choice ? p.choice : "cancelled";
        break;
      }
      case "turn.settled": {
        const turn = this.turns.get(p.admission_id);
        if (turn) {
          turn.outcome = p.outcome;
          turn.error = p.error || null;
        }
        if (this.running === p.admission_id) this.running = null;
        this.open = [];
        break;
      }
      case "admission.updated": {
        // `prompt.resolve_unknown` gives a lost turn's admission its final outcome.
        const turn = this.turns.get(p.admission_id);
        if (turn && turn.outcome === "unknown" && p.outcome) turn.resolved = p.outcome;
        break;
      }
      default:
    }
    return true;
  }

  // Reads the stored events it has not taken yet, up to `last` at least (a new stream: from
  // the start).
  async catchUp(sessionId, epoch, last) {
    if (epoch !== this.epoch) {
      Object.assign(this, new TurnHistory());
      this.epoch = epoch;
    }
    while (this.upTo < last) {
      const page = await rpc.call("session.events.since", {
        session_id: sessionId,
        replay_epoch: epoch,
        last_sequence: this.upTo,
      });
      if (page.snapshot_required || !page.events.length) break;
      for (const e of page.events) this.take({ ...e, replay_epoch: epoch });
      if (!page.has_more) break;
    }
  }

  // The tool call's marks for its block: its approval answer, and when it has no result,
  // whether it still runs or its turn ended without one.
  toolMarks(toolId, hasResult, sessionRunning) {
    const t = this.tools.get(toolId);
    const turn = t && this.turns.get(t.turn);
    const marks = { toolId, approval: t ? t.approval || undefined : undefined };
    // A lost turn's open calls get an error result from the daemon: whether they ran is unknown.
    if (hasResult && t && t.is_error && turn && turn.outcome === "unknown") marks.ended = "unknown";
    if (hasResult) return marks;
    if (turn && turn.outcome) marks.ended = turn.outcome;
    else if (sessionRunning && (!t || t.turn === this.running)) marks.running = true;
    else marks.ended = "unfinished";
    return marks;
  }
}

class SessionView {
  constructor(id) {
    this.id = id;
    this.snap = null;
    this.lastSeq = 0;
    this.replayEpoch = null;
    this.generation = 0;
    this.liveText = "";
    this.history = new TurnHistory();
    this.refreshTimer = null;
    this.firstRender = true;
    this.head = h("div");
    this.prompts = h("div", { id: "prompts" });
    // The `always` answer being confirmed ({prompt_id, scope}), and what the last one stored.
    this.confirming = null;
    this.stored = h("div");
    this.transcript = h("div", { class: "transcript", id: "transcript" });
    this.live = h("div", { id: "live" });
    this.pending = h("div", { id: "pending" });
    this.extras = h("div");
    this.input = h("textarea", { id: "input", placeholder: "Send a message to this session…" });
    this.send = h("button", { class: "primary", id: "send", onclick: () => this.submit() }, "Send");
    this.root = h(
      "section",
      { id: "session", "data-session": id },
      this.head,
      this.prompts,
      this.stored,
      this.transcript,
      this.live,
      this.pending,
      h("div", { class: "composer" }, this.input, this.send),
      this.extras,
    );
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) this.submit();
    });
  }

  async connected() {
    // Events missed while away come from the stored stream; then `session.resume` attaches
    // this connection again (its snapshot is the page's truth).
    if (this.replayEpoch !== null) {
      let missed = 0;
      for (;;) {
        const page = await rpc.call("session.events.since", {
          session_id: this.id,
          replay_epoch: this.replayEpoch,
          last_sequence: this.lastSeq,
        });
        if (page.snapshot_required) break;
        for (const e of page.events) {
          this.event(e);
          missed++;
        }
        if (!page.has_more) break;
      }
      this.root.dataset.caughtUp = String(missed);
    }
    await this.load();
  }

  async load() {
    const snap = await rpc.call("session.resume", { session_id: this.id });
    // What each turn of this session and of the sessions it delegated to spent.
    this.spend = await rpc.call("usage.report", { by: "turn", session_id: this.id }).catch(() => null);
    this.snap = snap;
    this.replayEpoch = snap.replay_epoch;
    this.lastSeq = Math.max(this.lastSeq, snap.last_sequence);
    this.generation = snap.execution_generation;
    await this.history.catchUp(this.id, snap.replay_epoch, snap.last_sequence);
    if (!snap.running) {
      this.liveText = "";
      this.live.replaceChildren();
    }
    this.render();
  }

  scheduleRefresh() {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => {
      if (rpc.connected) this.load().catch(showError);
    }, 80);
  }

  render() {
    const s = this.snap;
    const info = s.info;
    const unknown = s.pending.find((p) => p.status === "unknown");
    const state = unknown
      ? "paused_unknown"
      : s.prompts.some((p) => p.kind === "approval")
        ? "waiting_approval"
        : s.prompts.length
          ? "waiting_clarify"
          : s.running
            ? "running"
            : "idle";
    this.head.replaceChildren(
      h("h1", {}, info.title || `Session ${short(s.session_id)}`),
      h(
        "div",
        { class: "meta" },
        h("span", {}, "state ", badge("state", state, STATE_WORDS[state])),
        h("span", { class: "agent" }, "agent ", h("b", {}, agentName(info.agent))),
        h("span", {}, "model ", h("b", {}, info.model)),
        h("span", {}, "source ", h("b", {}, info.source)),
        h("span", {}, "cwd ", h("b", { class: "mono" }, info.cwd)),
        h("span", {}, "generation ", h("b", {}, String(s.execution_generation))),
        h("span", { class: "mono muted" }, s.session_id),
      ),
      h(
        "div",
        { class: "actions" },
        h(
          "button",
          { id: "interrupt", class: "danger", disabled: !s.running, onclick: () => this.interrupt() },
          "Interrupt",
        ),
        unknown
          ? h(
              "button",
              { id: "resolve", onclick: () => this.admission("prompt.resolve_unknown", unknown.admission_id) },
              "Resolve unknown",
            )
          : null,
      ),
    );
    const follow = this.firstRender || nearBottom();
    this.firstRender = false;
    this.renderPrompts(s.prompts);
    this.renderTranscript(s.messages, s.running);
    this.renderPending(s.pending);
    this.renderExtras(s);
    if (follow) scrollToBottom();
  }

  renderPrompts(prompts) {
    // A confirmation of a prompt answered meanwhile (by another client) closes with it.
    if (this.confirming && !prompts.some((p) => p.prompt_id === this.confirming.prompt_id)) this.confirming = null;
    this.prompts.replaceChildren(...prompts.map((p) => this.promptCard(p)));
  }

  promptCard(p) {
    if (p.kind === "approval") {
      const confirming = this.confirming && this.confirming.prompt_id === p.prompt_id;
      return h(
        "div",
        { class: "prompt", "data-prompt": p.prompt_id, "data-kind": "approval" },
        h("h3", {}, "Approval needed"),
        h("div", {}, p.description),
        h("pre", { class: "command" }, p.command),
        confirming
          ? this.alwaysConfirmation(p)
          : h(
              "div",
              { class: "actions" },
              p.choices.map((c) =>
                h(
                  "button",
                  {
                    class: c === "deny" ? "danger" : c === "once" ? "primary" : "",
                    "data-choice": c,
                    onclick: () => {
                      if (c !== "always") return this.respond("approval.respond", p, { choice: c });
                      // Nothing is stored before the person has seen and confirmed its scope.
                      this.confirming = { prompt_id: p.prompt_id, scope: defaultOffer(alwaysOffers(p)) };
                      this.renderPrompts(this.snap ? this.snap.prompts : [p]);
                    },
                  },
                  CHOICE_WORDS[c] || c,
                ),
              ),
            ),
      );
    }
    const card = h(
      "div",
      { class: "prompt", "data-prompt": p.prompt_id, "data-kind": "clarify" },
      h("h3", {}, "Question"),
      h("div", { class: "body", html: renderMarkdown(p.question) }),
    );
    if (p.choices.length && p.multi_select) {
      const boxes = p.choices.map((c) => h("input", { type: "checkbox", value: c }));
      card.append(
        h("div", {}, p.choices.map((c, i) => h("label", {}, boxes[i], ` ${c}  `))),
        h(
          "div",
          { class: "actions" },
          h(
            "button",
            {
              class: "primary",
              onclick: () =>
                this.respond("clarify.respond", p, {
                  answer: boxes.filter((b) => b.checked).map((b) => b.value),
                }),
            },
            "Answer",
          ),
        ),
      );
    } else if (p.choices.length) {
      card.append(
        h(
          "div",
          { class: "actions" },
          p.choices.map((c) =>
            h("button", { "data-choice": c, onclick: () => this.respond("clarify.respond", p, { answer: c }) }, c),
          ),
        ),
      );
    } else {
      const text = h("input", { type: "text", size: 60 });
      card.append(
        h(
          "div",
          { class: "actions" },
          text,
          h(
            "button",
            { class: "primary", onclick: () => this.respond("clarify.respond", p, { answer: text.value }) },
            "Answer",
          ),
        ),
      );
    }
    return card;
  }

  // The confirmation of an `always` answer, in the prompt's card: the scopes it may take as
  // radio choices (the workspace picked), Confirm and Cancel. Kept open across re-renders.
  alwaysConfirmation(p) {
    const offers = alwaysOffers(p);
    const picked = this.confirming.scope;
    const choices = offers.map((o) =>
      h(
        "label",
        { class: "scope-offer", "data-scope": o.scope },
        h("input", {
          type: "radio",
          name: `scope-${p.prompt_id}`,
          value: o.scope,
          checked: o.scope === picked,
          onchange: () => {
            this.confirming.scope = o.scope;
          },
        }),
        ` ${o.text}`,
      ),
    );
    return h(
      "div",
      { class: "confirm", id: "always-confirm", role: "dialog", "aria-label": "Always allow" },
      h("div", { class: "confirm-title" }, "Always allow — where should the rule apply?"),
      choices,
      h(
        "div",
        { class: "actions" },
        h(
          "button",
          {
            class: "primary",
            id: "always-confirm-yes",
            onclick: () => this.storeAlways(p),
          },
          "Confirm",
        ),
        h(
          "button",
          {
            id: "always-confirm-cancel",
            onclick: () => {
              this.confirming = null;
              this.renderPrompts(this.snap ? this.snap.prompts : []);
            },
          },
          "Cancel",
        ),
      ),
    );
  }

  async storeAlways(p) {
    const offer = alwaysOffers(p).find((o) => o.scope === this.confirming.scope);
    this.confirming = null;
    const answer = { choice: "always" };
    if (offer && !offer.implied) answer.scope = offer.scope;
    const response = await this.respond("approval.respond", p, answer);
    if (!response) return;
    if (response.stored_rule) {
      const r = response.stored_rule;
      this.stored.replaceChildren(
        h(
          "div",
          { class: "stored-rule", id: "stored-rule", "data-scope": r.scope, "data-rule": r.rule_id },
          `Stored: always allow ${r.text}. `,
          h("a", { href: "#/approvals" }, "Approvals"),
          " lists and removes rules.",
        ),
      );
    } else if (response.status !== "resolved") {
      showError({ message: `the answer was not recorded: ${response.status}${response.reason ? ` (${response.reason})` : ""}` });
    }
  }

  renderTranscript(messages, running) {
    const results = new Map();
    for (const m of messages) {
      if (m.role === "tool" && m.tool_call_id) results.set(m.tool_call_id, m);
    }
    const out = [];
    for (const m of messages) {
      if (m.role === "system") continue;
      if (m.role === "tool" && m.tool_call_id) continue;
      const body = h("div", { class: "body", html: renderMarkdown(m.content || "") });
      const el = h(
        "div",
        { class: `msg ${m.role}`, "data-role": m.role, "data-message": m.id },
        h("div", { class: "who" }, m.role),
        m.content ? body : null,
      );
      for (const call of m.tool_calls || []) {
        const r = results.get(call.id);
        const marks = this.history.toolMarks(call.id, Boolean(r), running);
        const t = this.history.tools.get(call.id);
        el.append(toolBlock(call.function.name, call.function.arguments, r ? r.content : null, Boolean(t && t.is_error), marks));
      }
      out.push(el);
    }
    if (!out.length) out.push(h("div", { class: "empty" }, "No messages yet."));
    const last = this.lastTurnNote();
    if (last) out.push(last);
    this.transcript.replaceChildren(...out);
    // A call the transcript shows is not drawn again in the streaming block.
    for (const block of this.live.querySelectorAll("[data-tool-id]")) {
      if (this.transcriptHasTool(block.dataset.toolId)) block.remove();
    }
  }

  transcriptHasTool(toolId) {
    return Boolean(this.transcript.querySelector(`[data-tool-id="${CSS.escape(toolId)}"]`));
  }

  // The newest turn, when it ended otherwise than `completed`: what happened, and its error.
  lastTurnNote() {
    const id = this.history.order[this.history.order.length - 1];
    const turn = id && this.history.turns.get(id);
    if (!turn || !turn.outcome || turn.outcome === "completed") return null;
    return h(
      "div",
      { class: "turn-end", id: "last-turn", "data-outcome": turn.outcome },
      `The last turn ${turn.outcome === "unknown" ? "was lost" : "ended"}: `,
      badge("outcome", turn.outcome, OUTCOME_WORDS[turn.outcome] || turn.outcome),
      turn.resolved ? ` · resolved as ${turn.resolved}` : null,
      turn.error ? h("div", { class: "error-text" }, turn.error) : null,
    );
  }

  // Every turn of the session: its generation, how it ended and why.
  turnsTable() {
    const rows = this.history.order.map((id) => {
      const t = this.history.turns.get(id);
      const outcome = t.outcome || (id === this.history.running ? "running" : "");
      return h(
        "tr",
        { "data-turn": id, "data-outcome": outcome },
        h("td", { class: "num" }, String(t.generation)),
        h("td", { class: "mono" }, short(id)),
        h("td", {}, outcome ? badge("outcome", outcome, OUTCOME_WORDS[outcome] || outcome) : ""),
        h(
          "td",
          {},
          t.error ? h("span", { class: "error-text" }, t.error) : "",
          t.resolved ? h("span", { class: "muted" }, `resolved as ${t.resolved}`) : "",
        ),
      );
    });
    return h("div", { class: "panel", id: "turns" }, table(["Generation", "Turn", "Outcome", "Error"], h("tbody", {}, rows)));
  }

  renderPending(pending) {
    if (!pending.length) {
      this.pending.replaceChildren();
      return;
    }
    const items = pending.map((p) =>
      h(
        "li",
        { "data-admission": p.admission_id, "data-status": p.status },
        badge("status", p.status === "started" ? "running" : p.status === "unknown" ? "error" : "pending", p.status),
        h("span", { class: "text" }, p.kind === "compact" ? "(compaction)" : p.text),
        p.status === "queued"
          ? h("button", { onclick: () => this.admission("prompt.cancel", p.admission_id) }, "Cancel")
          : null,
        p.status === "unknown"
          ? h("button", { onclick: () => this.admission("prompt.resolve_unknown", p.admission_id) }, "Resolve unknown")
          : null,
      ),
    );
    this.pending.replaceChildren(h("h2", {}, "Queue"), h("ul", { class: "pending-list panel" }, items));
  }

  renderExtras(s) {
    const parts = [];
    if (this.history.order.length) parts.push(h("h2", {}, "Turns"), this.turnsTable());
    if (this.spend && this.spend.groups.length) {
      parts.push(h("h2", {}, "Spend"), spendTable(this.spend, this.id));
    }
    if (s.processes.length) {
      parts.push(h("h2", {}, "Background processes"), processTable(s.processes.map((p) => ({ ...p, session_id: s.session_id }))));
    }
    if (s.jobs.length) {
      parts.push(
        h("h2", {}, "Jobs"),
        table(
          ["Job", "Status", "Transport", "Attempt"],
          h(
            "tbody",
            {},
            s.jobs.map((j) =>
              h(
                "tr",
                {},
                h("td", {}, h("a", { href: `#/job/${j.job_id}` }, j.job_id)),
                h("td", {}, j.error ? h("span", { class: "error-text" }, j.error) : badge("status", j.status)),
                h("td", {}, j.transport || ""),
                h("td", { class: "num" }, j.attempt_id ?? ""),
              ),
            ),
          ),
        ),
      );
    }
    this.extras.replaceChildren(...parts);
  }

  liveBlock() {
    if (!this.live.firstChild) {
      this.live.append(
        h(
          "div",
          { class: "msg live", "data-role": "live" },
          h("div", { class: "who" }, "assistant · streaming"),
          h("div", { class: "body", id: "live-text" }),
          h("div", { id: "live-tools" }),
          h("div", { class: "muted", id: "live-progress" }),
        ),
      );
    }
    return this.live.firstChild;
  }

  event(e) {
    if (e.session_id !== this.id) return;
    if (e.seq !== undefined && e.seq !== null) {
      // One out of order (a gap after a drop) waits for the refresh's catch-up.
      this.history.take(e);
      if (e.seq <= this.lastSeq) return;
      this.lastSeq = e.seq;
    }
    const p = e.payload || {};
    switch (e.type) {
      case "turn.started":
        this.generation = p.execution_generation;
        this.liveText = "";
        this.live.replaceChildren();
        this.liveBlock();
        this.scheduleRefresh();
        break;
      case "message.delta": {
        const follow = nearBottom();
        this.liveText += p.text || "";
        const el = this.liveBlock().querySelector("#live-text");
        el.innerHTML = renderMarkdown(this.liveText);
        if (follow) scrollToBottom();
        break;
      }
      case "tool.start":
        // Drawn here until the refresh draws it in the transcript, which then owns it.
        if (!this.transcriptHasTool(p.tool_id)) {
          this.liveBlock()
            .querySelector("#live-tools")
            .append(Object.assign(toolBlock(p.name, p.args, null, false, { running: true, toolId: p.tool_id }), { id: `tool-${p.tool_id}` }));
        }
        this.scheduleRefresh();
        break;
      case "tool.complete": {
        const old = this.live.querySelector(`[id="tool-${CSS.escape(p.tool_id)}"]`);
        const block = Object.assign(toolBlock(p.name, p.args, p.result, p.is_error, { toolId: p.tool_id }), { id: `tool-${p.tool_id}` });
        if (this.transcriptHasTool(p.tool_id)) {
          if (old) old.remove();
          this.scheduleRefresh();
        } else if (old) old.replaceWith(block);
        else this.liveBlock().querySelector("#live-tools").append(block);
        break;
      }
      case "turn.progress": {
        const el = this.liveBlock().querySelector("#live-progress");
        el.textContent = `${p.phase.replace("_", " ")} · ${(p.elapsed_ms / 1000).toFixed(1)} s`;
        break;
      }
      case "approval.request":
      case "clarify.request":
        if (this.snap) {
          this.snap.prompts = this.snap.prompts.filter((x) => x.prompt_id !== p.prompt_id).concat([p]);
          this.renderPrompts(this.snap.prompts);
        }
        this.scheduleRefresh();
        break;
      case "approval.settled":
      case "clarify.settled":
        if (this.snap) {
          this.snap.prompts = this.snap.prompts.filter((x) => x.prompt_id !== p.prompt_id);
          this.renderPrompts(this.snap.prompts);
        }
        this.scheduleRefresh();
        break;
      default:
        // message.complete, turn.settled, admission.updated, session.compacted, mcp.status:
        // the snapshot says what they changed.
        this.scheduleRefresh();
    }
  }

  async call(method, params) {
    try {
      return await rpc.call(method, params);
    } catch (e) {
      showError(e);
      return null;
    } finally {
      this.scheduleRefresh();
    }
  }

  respond(method, prompt, answer) {
    return this.call(method, {
      session_id: this.id,
      execution_generation: prompt.execution_generation,
      prompt_id: prompt.prompt_id,
      ...answer,
    });
  }

  admission(method, admissionId) {
    return this.call(method, { session_id: this.id, admission_id: admissionId });
  }

  interrupt() {
    return this.call("session.interrupt", { session_id: this.id, execution_generation: this.generation });
  }

  async submit() {
    const text = this.input.value;
    if (!text.trim()) return;
    const receipt = await this.call("prompt.submit", { session_id: this.id, input_id: newId(), text });
    if (receipt) this.input.value = "";
  }

  dispose() {
    clearTimeout(this.refreshTimer);
    if (rpc.connected) rpc.call("session.detach", { session_id: this.id }).catch(() => {});
  }
}

// Whether the page is scrolled to (about) its end: new content then keeps it there.
function nearBottom() {
  return window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
}

function scrollToBottom() {
  window.scrollTo(0, document.body.scrollHeight);
}

function heartbeat(j) {
  const c = j.contract;
  if (["completed", "error", "cancelled"].includes(j.status)) {
    return `finished ${ago(j.updated_at)} · the contract no longer applies`;
  }
  const last = j.last_activity_at;
  const since = last ? Math.max(0, now() - last) : null;
  const parts = [];
  if (j.status === "pending") {
    const from = j.delivered_at ?? j.created_at;
    parts.push(`waiting for started: ${seconds(Math.floor(now() - from))} of ${seconds(c.ack_timeout_sec)}`);
  } else if (since !== null) {
    parts.push(`last ${seconds(Math.floor(since))} ago`);
  }
  parts.push(`every ${seconds(c.heartbeat_sec)}, dead after ${seconds(c.idle_timeout_sec)} silent`);
  return parts.join(" · ");
}

class JobsView extends PolledView {
  constructor() {
    super(2000);
    this.table = h("tbody");
    this.root = h(
      "section",
      { id: "jobs" },
      h("h1", {}, "Jobs"),
      h("p", { class: "muted", id: "registry" }, ""),
      table(["Job", "Status", "Transport", "Attempt", "Last event", "Heartbeat (contract)"], this.table),
    );
  }

  async refresh() {
    const list = await rpc.call("job.list");
    this.root.querySelector("#registry").textContent = `Registry ${list.registry_dir}`;
    this.table.replaceChildren();
    if (!list.jobs.length) {
      this.table.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No jobs in the home registry.")));
    }
    for (const j of list.jobs.slice().reverse()) {
      const last = j.last_event;
      this.table.append(
        h(
          "tr",
          { "data-job": j.job_id },
          h("td", {}, h("a", { href: `#/job/${j.job_id}`, class: "mono" }, j.job_id), h("div", { class: "muted" }, j.prompt.slice(0, 90))),
          h("td", { class: "job-status" }, badge("status", j.status), j.detail ? h("div", { class: "muted" }, j.detail) : null),
          h("td", {}, j.transport, j.agent_session ? h("div", { class: "muted mono" }, j.agent_session) : null),
          h(
            "td",
            { class: "num" },
            String(j.attempt_id),
            j.status === "pending" && !j.delivered ? h("div", { class: "muted" }, "not delivered") : null,
          ),
          h("td", {}, last ? `${last.event}${last.detail ? ` (${last.detail})` : ""} · ${ago(last.ts)}` : h("span", { class: "muted" }, "none")),
          h(
            "td",
            {},
            heartbeat(j),
            j.overdue ? h("div", { class: "overdue" }, `overdue: ${j.overdue}`) : null,
          ),
        ),
      );
    }
  }
}

class JobView extends PolledView {
  constructor(id) {
    super(2000);
    this.id = id;
    this.summary = h("div");
    this.table = h("tbody");
    this.after = 0;
    this.root = h(
      "section",
      { id: "job", "data-job": id },
      h("h1", {}, `Job ${id}`),
      this.summary,
      h("h2", {}, "Event log"),
      table(["#", "Seq", "Event", "Attempt", "When", "Detail"], this.table),
    );
  }

  async refresh() {
    const list = await rpc.call("job.list");
    const j = list.jobs.find((x) => x.job_id === this.id);
    if (!j) {
      this.summary.replaceChildren(h("div", { class: "empty" }, "No such job in the home registry."));
      return;
    }
    const c = j.contract;
    this.summary.replaceChildren(
      h(
        "div",
        { class: "panel" },
        h(
          "div",
          { class: "meta" },
          h("span", { class: "job-status" }, "status ", badge("status", j.status)),
          j.detail ? h("span", {}, "detail ", h("b", {}, j.detail)) : null,
          h("span", {}, "transport ", h("b", {}, j.transport)),
          j.agent_session ? h("span", {}, "agent ", h("b", { class: "mono" }, j.agent_session)) : null,
          h("span", {}, "attempt ", h("b", {}, String(j.attempt_id))),
          h("span", {}, "delivered ", h("b", {}, j.delivered ? "yes" : "no")),
        ),
        h(
          "div",
          { class: "meta" },
          h("span", {}, "heartbeat every ", h("b", {}, seconds(c.heartbeat_sec))),
          h("span", {}, "dead after ", h("b", {}, `${c.heartbeat_misses} missed (${seconds(c.idle_timeout_sec)})`)),
          h("span", {}, "started within ", h("b", {}, seconds(c.ack_timeout_sec))),
          h("span", {}, heartbeat(j)),
          j.overdue ? h("span", { class: "overdue" }, `overdue: ${j.overdue}`) : null,
        ),
        h("p", {}, j.prompt),
      ),
    );
    const events = await rpc.call("job.events", { job_id: this.id, after: this.after });
    for (const e of events.entries) {
      this.after = Math.max(this.after, e.id);
      this.table.prepend(
        h(
          "tr",
          { "data-entry": e.id, class: e.audit ? "muted" : "" },
          h("td", { class: "num" }, String(e.id)),
          h("td", { class: "num" }, e.seq ?? "audit"),
          h("td", {}, e.event),
          h("td", { class: "num" }, String(e.attempt_id)),
          h("td", {}, new Date(e.ts * 1000).toLocaleTimeString()),
          h("td", {}, e.detail ?? ""),
        ),
      );
    }
  }
}

// A session's spend, turn by turn (`usage.report` by turn): the turns of the sessions it
// delegated to are named by their session; the last line is the total.
function spendTable(report, sessionId) {
  const row = (label, spend, cls) =>
    h(
      "tr",
      cls ? { class: cls } : {},
      h("td", { class: "mono" }, label),
      h("td", { class: "num" }, String(spend.api_calls)),
      h("td", { class: "num" }, spend.input_tokens.toLocaleString()),
      h("td", { class: "num" }, spend.output_tokens.toLocaleString()),
      h("td", { class: "num" }, spend.total_tokens.toLocaleString()),
      h("td", { class: "num" }, costText(spend) || "–"),
    );
  const rows = report.groups.map((g) =>
    row(
      g.session_id === sessionId ? `turn ${short(g.key)}` : `delegated ${short(g.session_id)} · turn ${short(g.key)}`,
      g,
      "spend-turn",
    ),
  );
  rows.push(row("total", report.total, "spend-total"));
  return h(
    "div",
    { class: "panel", id: "spend" },
    table(["Turn", "Requests", "Input", "Output", "Total tokens", "Cost (USD)"], h("tbody", {}, rows)),
  );
}

function processTable(processes) {
  return table(
    ["Session", "Process", "Command", "Status", "Pid", "Started"],
    h(
      "tbody",
      {},
      processes.map((p) =>
        h(
          "tr",
          { "data-process": p.id },
          h("td", {}, h("a", { href: `#/session/${p.session_id}` }, p.title || `session ${short(p.session_id)}`)),
          h("td", { class: "mono" }, p.id),
          h("td", {}, h("code", {}, p.command)),
          h("td", {}, badge("status", p.status === "running" ? "running" : p.status === "exited" && p.exit_code === 0 ? "completed" : "error", p.status + (p.exit_code !== null && p.exit_code !== undefined ? ` (${p.exit_code})` : ""))),
          h("td", { class: "num" }, String(p.pid)),
          h("td", {}, ago(p.started_at)),
        ),
      ),
    ),
  );
}

class ProcessesView extends PolledView {
  constructor() {
    super(5000);
    this.body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
    this.root = h("section", { id: "processes" }, h("h1", {}, "Background processes"), this.body);
  }

  async refresh() {
    // Each session's snapshot lists its processes; the view attaches only while it reads.
    const page = await rpc.call("session.list", { limit: 200 });
    const all = [];
    for (const s of page.sessions) {
      const snap = await rpc.call("session.resume", { session_id: s.session_id });
      await rpc.call("session.detach", { session_id: s.session_id });
      for (const p of snap.processes) all.push({ ...p, session_id: s.session_id, title: s.title });
    }
    this.body.replaceChildren(all.length ? processTable(all) : h("div", { class: "empty" }, "No background processes."));
  }
}

// Where a rule came from: the session whose prompt was answered, and the command asked for.
function ruleOrigin(r) {
  const o = r.origin || {};
  if (!o.session_id && !o.command) return h("span", { class: "muted" }, "stored before rules had scopes");
  return h(
    "span",
    {},
    o.session_id ? h("a", { href: `#/session/${encodeURIComponent(o.session_id)}`, class: "mono" }, o.session_id.slice(0, 8)) : null,
    o.command ? h("div", { class: "mono" }, o.command) : null,
  );
}

// The home's stored `always` rules (`approvals.list`): each one's class, scope and origin, and a
// button that removes it (`approvals.remove`).
class ApprovalsView extends PolledView {
  constructor() {
    super(5000);
    this.body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
    this.root = h(
      "section",
      { id: "approvals" },
      h("h1", {}, "Always rules"),
      h(
        "p",
        { class: "muted" },
        "Each rule lets every command of its class run without asking, where its scope says.",
      ),
      this.body,
    );
  }

  async refresh() {
    const list = await rpc.call("approvals.list");
    if (!list.rules.length) {
      this.body.replaceChildren(h("div", { class: "empty" }, "No stored always rules."));
      return;
    }
    this.body.replaceChildren(
      table(
        ["Class", "Scope", "Allows", "From", "Stored", ""],
        h(
          "tbody",
          {},
          list.rules.map((r) =>
            h(
              "tr",
              { "data-rule": r.rule_id, "data-scope": r.scope, "data-key": r.pattern_key },
              h("td", { class: "rule-class" }, r.class),
              h(
                "td",
                { class: "rule-scope" },
                SCOPE_WORDS[r.scope] || r.scope,
                r.path ? h("div", { class: "mono" }, r.path) : null,
              ),
              h("td", { class: "rule-text" }, r.text),
              h("td", {}, ruleOrigin(r)),
              h("td", {}, ago(r.created_at)),
              h(
                "td",
                {},
                h(
                  "button",
                  {
                    class: "danger",
                    "data-remove": r.rule_id,
                    onclick: async () => {
                      try {
                        await rpc.call("approvals.remove", { rule_id: r.rule_id });
                      } catch (e) {
                        showError(e);
                      }
                      this.poller.tick();
                    },
                  },
                  "Remove",
                ),
              ),
            ),
          ),
        ),
      ),
    );
  }
}

class McpView extends PolledView {
  constructor() {
    super(3000);
    this.body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
    this.root = h("section", { id: "mcp" }, h("h1", {}, "MCP servers"), this.body);
  }

  async refresh() {
    const status = await rpc.call("mcp.status");
    if (!status.servers.length) {
      this.body.replaceChildren(h("div", { class: "empty" }, "No MCP servers are configured ([mcp_servers.<name>] in config.toml)."));
      return;
    }
    this.body.replaceChildren(
      table(
        ["Server", "State", "Tools", "Pid", "Last error"],
        h(
          "tbody",
          {},
          status.servers.map((s) =>
            h(
              "tr",
              { "data-server": s.name },
              h("td", { class: "mono" }, s.name),
              h("td", {}, badge("status", s.state === "ready" ? "completed" : s.state === "failed" ? "error" : s.state === "starting" ? "pending" : "cancelled", s.state)),
              h("td", {}, s.tools.length ? s.tools.map((t) => h("div", { class: "mono" }, t)) : h("span", { class: "muted" }, "none listed yet")),
              h("td", { class: "num" }, s.pid ?? ""),
              h("td", { class: s.last_error ? "error-text" : "muted" }, s.last_error || "none"),
            ),
          ),
        ),
      ),
    );
  }
}

// ---------------------------------------------------------------------------------------------
// Routing: #/sessions, #/session/<id>, #/jobs, #/job/<id>, #/processes, #/mcp, #/approvals.

let current = null;

// Where this origin keeps its login credential. Origin storage, unlike a cookie, is per port:
// no other server on this host ever receives it.
const LOGIN_KEY = "drover_login";

// `#/login/<credential>` (the redirect of a login link): keep the credential, take it out of
// the address bar and the history, and show the sessions. Gives whether there was one.
function takeLogin() {
  const prefix = "#/login/";
  if (!location.hash.startsWith(prefix)) return false;
  localStorage.setItem(LOGIN_KEY, decodeURIComponent(location.hash.slice(prefix.length)));
  history.replaceState(null, "", "/ui/#/sessions");
  route();
  if (rpc.ws) rpc.ws.close();
  return true;
}

function route() {
  const [, name, arg] = (location.hash || "#/sessions").split("/");
  if (current) current.dispose();
  const id = arg ? decodeURIComponent(arg) : "";
  switch (name) {
    case "session":
      current = new SessionView(id);
      break;
    case "jobs":
      current = new JobsView();
      break;
    case "job":
      current = new JobView(id);
      break;
    case "processes":
      current = new ProcessesView();
      break;
    case "mcp":
      current = new McpView();
      break;
    case "approvals":
      current = new ApprovalsView();
      break;
    default:
      current = new SessionsView();
  }
  const top = { session: "sessions", job: "jobs" }[name] || name || "sessions";
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.view === top);
  }
  document.getElementById("view").replaceChildren(current.root);
  document.body.dataset.view = name || "sessions";
  if (rpc.connected) current.connected()?.catch?.(showError);
}

rpc.listeners.add((e) => current && current.event(e));
rpc.onOpen = async () => {
  try {
    await learnDaemon();
  } catch (e) {
    // Reached the old owner of a handoff: try again until the next one answers.
    if (rpc.restart && rpc.ws) rpc.ws.close();
    else showError(e);
    return;
  }
  try {
    if (current) await current.connected();
  } catch (e) {
    showError(e);
  }
};
rpc.onRefused = () => explainRefusal();
window.addEventListener("hashchange", () => takeLogin() || route());

// For tests and debugging: drop the connection and come back (the reconnect path).
window.droverDashboard = {
  hold: () => rpc.hold(),
  release: () => rpc.release(),
  escapeHtml,
};

if (!takeLogin()) route();
rpc.open();
