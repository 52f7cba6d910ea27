// A headless ACP client built on the official TypeScript SDK (@agentclientprotocol/sdk 2.x),
// used by tests/test_interop.py to prove crow works with a client written elsewhere.
//
//   node acp_client.mjs --cwd DIR --prompt TEXT [--prompt TEXT ...] [--wire FILE] -- AGENT_CMD [ARGS...]
//
// The agent inherits this process's environment. The script runs initialize, session/new,
// the prompts in order (answering permission requests with an allow option), then the
// extension method `_crow.compact` and an unknown extension method, and prints one JSON
// summary line on stdout.
// Every JSON-RPC message in either direction is appended to --wire (NDJSON) as evidence.
// ACP_SDK_NODE_MODULES names the node_modules folder holding the SDK (the tests install it
// into a cache folder, outside the repo).

import { spawn } from "node:child_process";
import { appendFileSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

import { tapped } from "./tap.mjs";

function parseArgs(argv) {
  const opts = { cwd: process.cwd(), prompts: [], wire: null, agent: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      opts.agent = argv.slice(i + 1);
      break;
    } else if (a === "--cwd") opts.cwd = argv[++i];
    else if (a === "--prompt") opts.prompts.push(argv[++i]);
    else if (a === "--wire") opts.wire = argv[++i];
    else throw new Error(`unknown argument ${a}`);
  }
  if (opts.agent.length === 0) throw new Error("missing agent command after --");
  if (opts.prompts.length === 0) opts.prompts.push("hello");
  return opts;
}

// The package is ESM-only and ESM ignores NODE_PATH: resolve the "import" entry of its
// package.json exports by hand.
const base = process.env.ACP_SDK_NODE_MODULES ?? path.join(import.meta.dirname, "node_modules");
const pkgDir = path.join(base, "@agentclientprotocol", "sdk");
const pkg = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8"));
const sdkVersion = pkg.version;

const opts = parseArgs(process.argv.slice(2));
const acp = await import(pathToFileURL(path.join(pkgDir, pkg.exports["."].import)).href);
if (opts.wire) writeFileSync(opts.wire, "");
const wire = (dir, msg) => {
  if (opts.wire) appendFileSync(opts.wire, JSON.stringify({ dir, msg }) + "\n");
};

const child = spawn(opts.agent[0], opts.agent.slice(1), {
  stdio: ["pipe", "pipe", "inherit"],
  env: process.env,
});
const childExit = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));

const raw = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
// tap both directions so the test can show the wire when something breaks
const stream = tapped(
  raw,
  (msg) => wire("in", msg),
  (msg) => wire("out", msg),
);

const summary = {
  sdkVersion: null,
  protocolVersion: null,
  agentName: null,
  extensions: null,
  sessionId: null,
  stopReasons: [],
  updateKinds: [],
  toolCalls: {},
  permissionRequests: [],
  text: "",
  compact: null,
  compactError: null,
  unknownMethodError: null,
  handlerErrors: [],
};

const app = acp
  .client({ name: "crow-interop" })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    summary.permissionRequests.push({
      toolCallId: params.toolCall.toolCallId,
      options: params.options.map((o) => o.kind),
    });
    const allow = params.options.find((o) => o.kind === "allow_once") ??
      params.options.find((o) => o.kind.startsWith("allow"));
    if (!allow) return { outcome: { outcome: "cancelled" } };
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    const u = params.update;
    summary.updateKinds.push(u.sessionUpdate);
    if (u.sessionUpdate === "agent_message_chunk" && u.content.type === "text") {
      summary.text += u.content.text;
    } else if (u.sessionUpdate === "tool_call") {
      summary.toolCalls[u.toolCallId] = {
        title: u.title,
        kind: u.kind ?? null,
        rawInput: u.rawInput ?? null,
        statuses: [u.status ?? "pending"],
        content: [],
      };
    } else if (u.sessionUpdate === "tool_call_update") {
      const call = (summary.toolCalls[u.toolCallId] ??= { statuses: [], content: [] });
      if (u.status) call.statuses.push(u.status);
      for (const c of u.content ?? []) {
        if (c.type === "content" && c.content.type === "text") call.content.push(c.content.text);
      }
    }
  });

let exitCode = 0;
try {
  await app.connectWith(stream, async (ctx) => {
    const init = await ctx.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name: "crow-interop", version: "0" },
    });
    summary.protocolVersion = init.protocolVersion;
    summary.agentName = init.agentInfo?.name ?? null;
    summary.extensions = init.agentCapabilities?._meta?.crow?.extensions ?? null;

    const session = await ctx.buildSession({ cwd: opts.cwd, mcpServers: [] }).start();
    summary.sessionId = session.sessionId;
    for (const prompt of opts.prompts) {
      const response = await session.prompt(prompt);
      summary.stopReasons.push(response.stopReason);
    }
    session.dispose();

    // extension methods: the TypeScript SDK sends the method name verbatim, so the
    // underscore prefix is ours to write
    try {
      summary.compact = await ctx.request("_crow.compact", { sessionId: session.sessionId });
    } catch (err) {
      summary.compactError = { code: err.code ?? null, message: String(err.message ?? err) };
    }
    try {
      await ctx.request("_crow.nope", {});
    } catch (err) {
      summary.unknownMethodError = { code: err.code ?? null, message: String(err.message ?? err) };
    }
  });
} catch (err) {
  summary.handlerErrors.push(String(err?.stack ?? err));
  exitCode = 1;
}

child.stdin.end();
const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
const exit = await childExit;
clearTimeout(timer);
summary.agentExit = exit;
summary.sdkVersion = sdkVersion;
process.stdout.write(JSON.stringify(summary) + "\n");
process.exit(exitCode);
