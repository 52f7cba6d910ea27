// A scriptable ACP client on the official TypeScript SDK (@agentclientprotocol/sdk 2.x): the
// SDK validates every message it receives against schema 1.25, so a test drives crow through
// it to prove a client written elsewhere accepts what crow sends.
//
//   node acp_script.mjs SCRIPT.json -- AGENT_CMD [ARGS...]
//   node acp_script.mjs SCRIPT.json -- ws://HOST:PORT     (an agent serving ACP over WebSocket:
//        one JSON-RPC message per text frame, Authorization: Bearer $ACP_WS_TOKEN; Node's own
//        WebSocket, behind --experimental-websocket before Node 22)
//
// SCRIPT: {"capabilities": {...clientCapabilities}, "permission": "allow_once" | "reject_once"
//   | "cancel", "permissions": [one of those per request, in order; then "permission"],
//   "elicitation": {"action": "accept", "content": {...}} | {"action": "decline"},
//   "elicitations": [one of those per elicitation/create, in order; then "elicitation"],
//   "steps": [STEP, ...]}
// STEP: {"request": METHOD, "params": {...}, "as": NAME, "wait": false}   (wait defaults true)
//       {"notify": METHOD, "params": {...}}
//       {"await": NAME}            (a request started with "wait": false)
//       {"sleep": MS}
//       {"until": UPDATE_KIND}     (wait, up to 10 s, for a session/update of that kind)
//       {"untilRequest": METHOD}   (wait, up to 10 s, for a request of crow's, e.g. terminal/create)
// Strings "${NAME.path.to.field}" in params are replaced by earlier results ("${NAME.id}" is
// the JSON-RPC id of request NAME, for $/cancel_request).
// Prints one JSON line: {sdkVersion, results: {NAME: {result} | {error}}, updates: [...],
// requests: [{method, params}], timeline: [{method, params}] (crow's requests and
// notifications as they came off the wire, in order: the SDK may run handlers out of it),
// handlerErrors: [...]}.
// Terminals (when "capabilities" advertise `terminal`): /bin/sh runs what terminal/create
// names, in a process group of its own that terminal/kill ends; every terminal/* request is
// recorded in `requests`.
// ACP_SDK_NODE_MODULES names the node_modules folder holding the SDK.

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

import { tapped } from "./tap.mjs";

const argv = process.argv.slice(2);
const sep = argv.indexOf("--");
const script = JSON.parse(readFileSync(argv[0], "utf8"));
const agent = argv.slice(sep + 1);

const base = process.env.ACP_SDK_NODE_MODULES ?? path.join(import.meta.dirname, "node_modules");
const pkgDir = path.join(base, "@agentclientprotocol", "sdk");
const pkg = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8"));
// "unstable": true in SCRIPT loads the SDK's unstable binding (it delivers subagent_update).
const entry = pkg.exports[script.unstable ? "./unstable" : "."].import;
const acp = await import(pathToFileURL(path.join(pkgDir, entry)).href);

// Over WebSocket there is no child: `end()` closes the socket, and its close is the "exit".
let end, childExit, raw;
if (/^wss?:\/\//.test(agent[0])) {
  const socket = new WebSocket(agent[0], { headers: { Authorization: `Bearer ${process.env.ACP_WS_TOKEN}` } });
  await new Promise((resolve, reject) => {
    socket.onopen = resolve;
    socket.onerror = () => reject(new Error(`cannot open ${agent[0]}`));
  });
  let reading = true;
  childExit = new Promise((resolve) => socket.addEventListener("close", (e) => resolve({ code: e.code, signal: null })));
  raw = {
    readable: new ReadableStream({
      start(controller) {
        socket.addEventListener("message", (e) => reading && controller.enqueue(JSON.parse(String(e.data))));
        socket.addEventListener("close", () => reading && controller.close());
      },
      cancel() {
        reading = false; // the SDK stopped reading: the connection is over
        socket.close(1000);
      },
    }),
    writable: new WritableStream({ write: (msg) => socket.send(JSON.stringify(msg)) }),
  };
  end = { close: () => socket.close(1000), kill: () => socket.close(1000) };
} else {
  const child = spawn(agent[0], agent.slice(1), { stdio: ["pipe", "pipe", "inherit"], env: process.env });
  childExit = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  raw = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  end = { close: () => child.stdin.end(), kill: () => child.kill("SIGKILL") };
}

// request ids as written, by method and order, so "${NAME.id}" can name one
let nextOutgoingId = [];
const stream = tapped(
  raw,
  (msg) => {
    if (msg.method) out.timeline.push({ method: msg.method, params: msg.params });
  },
  (msg) => {
    if (msg.method && msg.id !== undefined) nextOutgoingId.push(msg.id);
  },
);

const out = { sdkVersion: pkg.version, results: {}, updates: [], requests: [], timeline: [], handlerErrors: [] };
const answers = [...(script.permissions ?? [])];
const elicitationAnswers = [...(script.elicitations ?? [])];
const ids = {};
const waiters = [];
const requestWaiters = [];
const terminals = new Map();
let terminalsMade = 0;

function record(method, params) {
  out.requests.push({ method, params });
  for (const w of requestWaiters.splice(0)) w(method);
}

function terminal(params) {
  const t = terminals.get(params.terminalId);
  if (!t) throw new Error(`unknown terminal ${params.terminalId}`);
  return t;
}

function createTerminal(params) {
  const env = { ...process.env };
  for (const e of params.env ?? []) env[e.name] = e.value;
  const proc = spawn(params.command, params.args ?? [], {
    cwd: params.cwd ?? undefined,
    env,
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const t = { proc, output: "", exit: null };
  proc.stdout.on("data", (d) => (t.output += d));
  proc.stderr.on("data", (d) => (t.output += d));
  t.exited = new Promise((resolve) =>
    proc.on("close", (code, signal) => resolve((t.exit = { exitCode: code, signal: signal ?? null }))),
  );
  const terminalId = `term-${++terminalsMade}`;
  terminals.set(terminalId, t);
  return { terminalId };
}

function killTerminal(t) {
  if (t.exit === null) {
    try {
      process.kill(-t.proc.pid, "SIGKILL");
    } catch {}
  }
}

const app = acp
  .client({ name: "crow-script" })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    record("session/request_permission", params);
    const want = answers.shift() ?? script.permission ?? "allow_once";
    const option = params.options.find((o) => o.kind === want);
    if (want === "cancel" || !option) return { outcome: { outcome: "cancelled" } };
    return { outcome: { outcome: "selected", optionId: option.optionId } };
  })
  .onRequest(acp.methods.client.elicitation.create, ({ params }) => {
    record("elicitation/create", params);
    return elicitationAnswers.shift() ?? script.elicitation ?? { action: "cancel" };
  })
  .onRequest(acp.methods.client.terminal.create, ({ params }) => {
    record("terminal/create", params);
    return createTerminal(params);
  })
  .onRequest(acp.methods.client.terminal.waitForExit, async ({ params }) => {
    record("terminal/wait_for_exit", params);
    return await terminal(params).exited;
  })
  .onRequest(acp.methods.client.terminal.output, ({ params }) => {
    record("terminal/output", params);
    const t = terminal(params);
    return { output: t.output, truncated: false, ...(t.exit ? { exitStatus: t.exit } : {}) };
  })
  .onRequest(acp.methods.client.terminal.kill, ({ params }) => {
    record("terminal/kill", params);
    killTerminal(terminal(params));
    return {};
  })
  .onRequest(acp.methods.client.terminal.release, ({ params }) => {
    record("terminal/release", params);
    killTerminal(terminal(params));
    terminals.delete(params.terminalId);
    return {};
  })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    out.updates.push(params);
    for (const w of waiters.splice(0)) w(params.update.sessionUpdate);
  });

function fill(value, results) {
  if (typeof value === "string") {
    const m = value.match(/^\$\{([^}]+)\}$/);
    if (!m) return value;
    const [name, ...rest] = m[1].split(".");
    if (rest.length === 1 && rest[0] === "id") return nextOutgoingId[ids[name]];
    let v = results[name]?.result;
    for (const key of rest) v = v?.[key];
    return v;
  }
  if (Array.isArray(value)) return value.map((v) => fill(v, results));
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fill(v, results)]));
  }
  return value;
}

// Resolves true once `wanted` is pushed through `queue` (false after `ms`); at once when
// `already` says it came before.
function waitFor(queue, wanted, already, ms = 10000) {
  if (already) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    const check = (got) => {
      if (got === wanted) {
        clearTimeout(timer);
        resolve(true);
      } else queue.push(check);
    };
    queue.push(check);
  });
}

const untilKind = (kind) => waitFor(waiters, kind, out.updates.some((u) => u.update.sessionUpdate === kind));
const untilRequest = (method) => waitFor(requestWaiters, method, out.requests.some((r) => r.method === method));

let exitCode = 0;
try {
  await app.connectWith(stream, async (ctx) => {
    const pending = {};
    const start = (step) => {
      const name = step.as ?? step.request;
      const before = nextOutgoingId.length;
      const p = ctx
        .request(step.request, fill(step.params ?? {}, out.results))
        .then((result) => (out.results[name] = { result: result ?? null }))
        .catch((err) => (out.results[name] = { error: { code: err.code ?? null, message: String(err.message ?? err), data: err.data ?? null } }));
      ids[name] = before;
      return p;
    };
    out.results.initialize = {
      result: await ctx.request(acp.methods.agent.initialize, {
        protocolVersion: acp.PROTOCOL_VERSION,
        clientCapabilities: script.capabilities ?? {},
        clientInfo: { name: "crow-script", version: "0" },
      }),
    };
    for (const step of script.steps ?? []) {
      if (step.request) {
        const p = start(step);
        if (step.wait === false) pending[step.as ?? step.request] = p;
        else await p;
      } else if (step.notify) {
        await ctx.notify(step.notify, fill(step.params ?? {}, out.results));
      } else if (step.await) {
        await pending[step.await];
      } else if (step.sleep) {
        await new Promise((r) => setTimeout(r, step.sleep));
      } else if (step.until) {
        if (!(await untilKind(step.until))) out.handlerErrors.push(`no ${step.until} update within 10 s`);
      } else if (step.untilRequest) {
        if (!(await untilRequest(step.untilRequest))) out.handlerErrors.push(`no ${step.untilRequest} within 10 s`);
      }
    }
    await Promise.all(Object.values(pending));
  });
} catch (err) {
  out.handlerErrors.push(String(err?.stack ?? err));
  exitCode = 1;
}

end.close();
const timer = setTimeout(end.kill, 5000);
out.agentExit = await childExit;
clearTimeout(timer);
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(exitCode);
