// Start cost in workerd alone (no miniflare, no database): bench/nodb-bare-worker.js
// plus what the package does for a protected request before its first database
// batch: instantiate the component (first request only), open the core session
// (first request only), admit the request, fingerprint it, plan the decision batch.
import { getCore, requestHead, sessionFor, sha256Hex } from "../src/worker.js";

const IDEMPOTENCY = {};

export default {
  async fetch(request) {
    const session = sessionFor(getCore(), IDEMPOTENCY, "sqlite");
    const admission = session.admit(requestHead(request), "bench");
    if (admission.tag !== "protected") return new Response(admission.tag, { status: 500 });
    const body = new Uint8Array(await request.arrayBuffer());
    const fingerprint = await sha256Hex(admission.val.fingerprintPrefix, body);
    const statements = session.planDecision("bench", admission.val.key, fingerprint, Date.now());
    return new Response(`{"ok":true,"statements":${statements.length}}`, { status: 201, headers: { "content-type": "application/json" } });
  },
};
