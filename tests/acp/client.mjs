// An ACP client on the official TypeScript SDK (@agentclientprotocol/sdk), for drover's
// end-to-end tests (crates/cli/tests/front_door/acp_clients.rs). It talks to an agent it spawns (the argv
// after `--`, over stdio) or to a WebSocket URL with a bearer token (the daemon's `/v1/acp`),
// runs the steps it is given, and writes JSON lines to stdout: one `{"event": ...}` line per
// thing that happens (so a test can act mid-run), then one `{"event": "result", ...}` line.
//
//   node client.mjs --steps '<JSON array>' [--timeout-ms N] -- <agent argv...>
//   node client.mjs --steps '<JSON array>' --ws ws://127.0.0.1:PORT/v1/acp --token TOKEN
//
// Steps (run in order; `session` is the one the last new/load/resume named):
//   {"op":"initialize", "clientCapabilities"?: {...}}      protocolVersion 1
//   {"op":"new", "cwd": DIR, "mcpServers"?: [...]}
//   {"op":"prompt", "text": T, "cancelOn"?: C, "wait"?: false}
//       C: "permission" (send session/cancel when a permission request comes, then answer
//       that request `cancelled`, as ACP asks of a client), or the `sessionUpdate` kind of the
//       first update that triggers it ("agent_message_chunk", "tool_call", ...).
//       "wait": false sends the prompt and goes on; its answer is recorded when it comes.
//   {"op":"wait_update", "kind": K, "count"?: N}   until N updates of kind K arrived in all
//   {"op":"wait_prompts"}                          until every prompt sent has its answer
//   {"op":"permissions", "answer": A}   how later permission requests are answered: an
//       optionId ("once", "session", "always", "deny"), "name:<text>" (the option whose name
//       is <text>, as a person picks), "cancel" (outcome cancelled), or "hold" (never, until a
//       stdin command answers)
//   {"op":"elicitations", "answer": A}   how later elicitation/create requests (forms, for a
//       client whose initialize offered `elicitation: {form: {}}`) are answered: a content
//       object (accepted with it), "decline" (the default) or "cancel"
//   {"op":"set_mode", "modeId": M}   {"op":"list", "cwd"?: DIR}   {"op":"close"}
//   {"op":"load", "sessionId"?: S, "cwd": DIR}   {"op":"resume", "sessionId"?: S, "cwd": DIR}
//   {"op":"cancel"}                  session/cancel of the current session
//   {"op":"request", "method": M, "params": P}   any request, for error cases
//   {"op":"kill_agent"}              SIGKILL the spawned agent (a crash under the client)
//   {"op":"wait_stdin"}              until the test writes `continue` on stdin (once per
//       wait_stdin: a test's barrier, e.g. to restart the daemon between two prompts)
// Stdin commands (one per line), for a test that sequences from outside: `cancel`,
// `answer <optionId>` and `answer-cancelled` (every held permission request), `continue` (lets
// one `wait_stdin` step go on, now or when it comes).
//
// The result: `steps` (each op with its request, result or error), `updates` (session/update
// params as the SDK delivered them, i.e. valid to a real client), `wire` (every JSON-RPC message
// each way, in order, as sent: to check ordering, e.g. a load's replay before its answer),
// `permissions` and `elicitations` (each request and how it was answered), `agentExit`, and
// `error` (a fatal one: timeout, transport gone) or null. Exit code 0 unless `error` is set.

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { Readable, Writable } from "node:stream";

import { client, methods, ndJsonStream } from "@agentclientprotocol/sdk";

function parseArgs(argv) {
  const args = { steps: [], timeoutMs: 60000, ws: null, token: null, agent: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      args.agent = argv.slice(i + 1);
      break;
    } else if (a === "--steps") {
      args.steps = JSON.parse(argv[++i]);
    } else if (a === "--timeout-ms") {
      args.timeoutMs = Number(argv[++i]);
    } else if (a === "--ws") {
      args.ws = argv[++i];
    } else if (a === "--token") {
      args.token = argv[++i];
    } else {
      throw new Error(`unknown argument ${a}`);
    }
  }
  if (!args.ws && args.agent.length === 0) {
    throw new Error("give an agent command after `--`, or --ws URL");
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

const result = {
  steps: [],
  updates: [],
  wire: [],
  permissions: [],
  elicitations: [],
  agentExit: null,
  error: null,
};

// Waiters on updates and prompt answers: re-checked after every event.
const waiters = new Set();
function notifyWaiters() {
  for (const w of [...waiters]) {
    if (w.cond()) {
      waiters.delete(w);
      w.resolve();
    }
  }
}
function until(cond) {
  if (cond()) return Promise.resolve();
  return new Promise((resolve) => waiters.add({ cond, resolve }));
}

let agentChild = null;
let agentExited = null;
let stream;
if (args.ws) {
  const { createWebSocketStream } = await import("@agentclientprotocol/sdk/experimental/ws-client");
  const { WebSocket } = await import("ws");
  const headers = args.token === null ? {} : { Authorization: `Bearer ${args.token}` };
  stream = createWebSocketStream(args.ws, { WebSocket, headers });
} else {
  agentChild = spawn(args.agent[0], args.agent.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  agentExited = new Promise((resolve) => {
    agentChild.on("exit", (code, signal) => {
      result.agentExit = { code, signal };
      out({ event: "agent_exit", code, signal });
      resolve();
    });
    agentChild.on("error", (e) => {
      result.agentExit = { error: String(e) };
      resolve();
    });
  });
  agentChild.stdin.on("error", () => {});
  stream = ndJsonStream(Writable.toWeb(agentChild.stdin), Readable.toWeb(agentChild.stdout));
}

// Every message each way, in wire order, before the SDK looks at it.
const tap = (dir) =>
  new TransformStream({
    transform(msg, controller) {
      result.wire.push({ dir, msg });
      controller.enqueue(msg);
    },
  });
const inbound = tap("in");
const outbound = tap("out");
outbound.readable.pipeTo(stream.writable).catch(() => {});
const tapped = { readable: stream.readable.pipeThrough(inbound), writable: outbound.writable };

let session = null;
let policy = "hold";
let elicitPolicy = "decline";
let cancelOn = null;
let agentCtx = null;
// Held permission requests: resolve functions taking an outcome.
const held = [];
const promptsSent = [];
// `continue` lines read from stdin, and `wait_stdin` steps run.
let continues = 0;
let stdinWaits = 0;

function answerFor(answer, params) {
  if (answer === "cancel") return { outcome: { outcome: "cancelled" } };
  if (answer.startsWith("name:")) {
    const name = answer.slice("name:".length);
    const option = (params?.options ?? []).find((o) => o.name === name);
    // No such option: an id no agent offers, so the agent's refusal shows in the result.
    return { outcome: { outcome: "selected", optionId: option?.optionId ?? answer } };
  }
  return { outcome: { outcome: "selected", optionId: answer } };
}

function sendCancel(why) {
  if (!session || !agentCtx) return;
  out({ event: "cancel", why });
  agentCtx.notify(methods.agent.session.cancel, { sessionId: session }).catch(() => {});
}

const app = client({ name: "drover-acp-test-client" })
  .onNotification(methods.client.session.update, ({ params }) => {
    result.updates.push(params);
    out({ event: "update", update: params });
    const kind = params.update?.sessionUpdate;
    if (cancelOn && cancelOn === kind) {
      cancelOn = null;
      sendCancel(`update ${kind}`);
    }
    notifyWaiters();
  })
  .onRequest(methods.client.session.requestPermission, ({ params }) => {
    const entry = { params, answer: null };
    result.permissions.push(entry);
    out({ event: "permission", params });
    notifyWaiters();
    let answer = policy;
    if (cancelOn === "permission") {
      cancelOn = null;
      sendCancel("permission");
      answer = "cancel";
    }
    if (answer === "hold") {
      return new Promise((resolve) => {
        held.push((a) => {
          entry.answer = a;
          resolve(answerFor(a, params));
        });
      });
    }
    entry.answer = answer;
    return answerFor(answer, params);
  })
  .onRequest(methods.client.elicitation.create, ({ params }) => {
    const answer = elicitPolicy;
    result.elicitations.push({ params, answer });
    out({ event: "elicitation", params });
    notifyWaiters();
    if (answer === "decline" || answer === "cancel") return { action: answer };
    return { action: "accept", content: answer };
  });

async function record(op, request, run) {
  const step = { op, request, result: null, error: null };
  result.steps.push(step);
  const started = Date.now();
  try {
    step.result = (await run()) ?? null;
  } catch (e) {
    step.error = e && typeof e === "object" && "code" in e
      ? { code: e.code, message: e.message, data: e.data ?? null }
      : { message: String(e?.message ?? e) };
  }
  step.ms = Date.now() - started;
  out({ event: "step", op, result: step.result, error: step.error });
  notifyWaiters();
  return step;
}

const countKind = (kind) => result.updates.filter((u) => u.update?.sessionUpdate === kind).length;

async function runStep(ctx, s) {
  switch (s.op) {
    case "initialize": {
      const request = {
        protocolVersion: 1,
        clientCapabilities: s.clientCapabilities ?? {
          fs: { readTextFile: false, writeTextFile: false },
          terminal: false,
        },
        clientInfo: { name: "drover-acp-test-client", version: "1.0.0" },
      };
      return record("initialize", request, () => ctx.request(methods.agent.initialize, request));
    }
    case "new": {
      const request = { cwd: s.cwd, mcpServers: s.mcpServers ?? [] };
      const step = await record("new", request, () => ctx.request(methods.agent.session.new, request));
      if (step.result?.sessionId) session = step.result.sessionId;
      return step;
    }
    case "load":
    case "resume": {
      const request = { sessionId: s.sessionId ?? session, cwd: s.cwd, mcpServers: s.mcpServers ?? [] };
      const method = s.op === "load" ? methods.agent.session.load : methods.agent.session.resume;
      const step = await record(s.op, request, () => ctx.request(method, request));
      if (!step.error) session = request.sessionId;
      return step;
    }
    case "prompt": {
      const request = { sessionId: session, prompt: [{ type: "text", text: s.text }] };
      cancelOn = s.cancelOn ?? null;
      const p = record("prompt", request, () => ctx.request(methods.agent.session.prompt, request));
      promptsSent.push(p);
      if (s.wait === false) return;
      return p;
    }
    case "wait_prompts":
      return Promise.all(promptsSent);
    case "wait_update":
      return until(() => countKind(s.kind) >= (s.count ?? 1));
    case "permissions":
      policy = s.answer;
      return;
    case "elicitations":
      elicitPolicy = s.answer;
      return;
    case "cancel":
      sendCancel("step");
      return;
    case "set_mode": {
      const request = { sessionId: s.sessionId ?? session, modeId: s.modeId };
      return record("set_mode", request, () => ctx.request(methods.agent.session.setMode, request));
    }
    case "list": {
      const request = s.cwd ? { cwd: s.cwd } : {};
      return record("list", request, () => ctx.request(methods.agent.session.list, request));
    }
    case "close": {
      const request = { sessionId: s.sessionId ?? session };
      return record("close", request, () => ctx.request(methods.agent.session.close, request));
    }
    case "request":
      return record(s.method, s.params, () => ctx.request(s.method, s.params));
    case "wait_stdin": {
      const n = ++stdinWaits;
      out({ event: "waiting_stdin", n });
      return until(() => continues >= n);
    }
    case "kill_agent":
      agentChild?.kill("SIGKILL");
      await agentExited;
      return;
    default:
      throw new Error(`unknown step ${JSON.stringify(s)}`);
  }
}

// Commands from the test, on stdin.
createInterface({ input: process.stdin }).on("line", (line) => {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === "cancel") {
    sendCancel("stdin");
  } else if (cmd === "answer" || cmd === "answer-cancelled") {
    const a = cmd === "answer" ? arg : "cancel";
    for (const resolve of held.splice(0)) resolve(a);
  } else if (cmd === "continue") {
    continues++;
    notifyWaiters();
  }
});

let exitCode = 0;
const timer = setTimeout(() => {
  result.error = `timed out after ${args.timeoutMs} ms`;
  finish(3);
}, args.timeoutMs);

let finished = false;
async function finish(code) {
  if (finished) return;
  finished = true;
  clearTimeout(timer);
  if (agentChild && result.agentExit === null) {
    // The agent gets its stdin closed, as an editor quitting does, then a bounded wait.
    agentChild.stdin.end();
    const gone = await Promise.race([
      agentExited.then(() => true),
      new Promise((r) => setTimeout(() => r(false), 5000)),
    ]);
    if (!gone) {
      agentChild.kill("SIGKILL");
      await agentExited;
    }
  }
  out({ event: "result", ...result });
  process.exit(code);
}

try {
  await app.connectWith(tapped, async (ctx) => {
    agentCtx = ctx;
    for (const s of args.steps) {
      await runStep(ctx, s);
    }
  });
} catch (e) {
  result.error = String(e?.stack ?? e);
  exitCode = 2;
}
await finish(exitCode);
