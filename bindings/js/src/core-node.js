// The component on Node: the core module read from generated/ and compiled
// once per process, instantiated on first use; and Node's SHA-256.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Core, CORE_MODULE_NAMES } from "./runtime.js";
import { setOpenTelemetryLoader } from "./telemetry.js";

// OpenTelemetry: `@opentelemetry/api` (an optional peer dependency) is
// required on the first exchange, from where the application's own copy
// resolves; when it is not installed, telemetry stays off.
setOpenTelemetryLoader(() => createRequire(import.meta.url)("@opentelemetry/api"));

const GENERATED = new URL("../generated/", import.meta.url);
let modules = null;
function getCoreModule(name) {
  if (modules === null) {
    modules = {};
    for (const n of CORE_MODULE_NAMES) modules[n] = new WebAssembly.Module(readFileSync(new URL(n, GENERATED)));
  }
  return modules[name];
}

let core = null;
/** The process's shared component instance (instantiated on first use). */
export function getCore() {
  if (core === null) core = new Core(getCoreModule);
  return core;
}

/** A fresh component instance of its own. */
export function newCore() {
  return new Core(getCoreModule);
}

/**
 * Lowercase hex SHA-256 of `prefix` (UTF-8) followed by `body`, with
 * node:crypto: synchronous (Web Crypto on Node costs a thread-pool round trip
 * per digest).
 */
export function sha256HexSync(prefix, body) {
  const hash = createHash("sha256").update(prefix, "utf8");
  if (typeof body === "string") hash.update(body, "utf8");
  else if (ArrayBuffer.isView(body)) hash.update(body);
  else if (body instanceof ArrayBuffer) hash.update(new Uint8Array(body));
  else if (body !== undefined && body !== null) throw new TypeError("body must be an ArrayBuffer, a typed array or a string");
  return hash.digest("hex");
}

/** What makeApi takes from the Node platform. */
export const NODE_PLATFORM = { digest: sha256HexSync };
