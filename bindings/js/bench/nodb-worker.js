// Start cost in workerd alone (no miniflare, no database): bench/nodb-bare-worker.js
// plus what the package does for a protected request before its first database
// batch: instantiate the component (first request only), open the core session
// (first request only), start the exchange (admission: read-body), fingerprint
// the body, and feed it (the core plans the decision batch).
import { getCore, requestHead, sessionFor, sha256Hex } from "../src/worker.js";

const IDEMPOTENCY = {};

export default {
  async fetch(request) {
    const session = sessionFor(getCore(), IDEMPOTENCY, "sqlite");
    const { action, exchange } = session.start(requestHead(request), "bench", Date.now());
    if (action.tag !== "read-body") {
      exchange?.drop();
      return new Response(action.tag, { status: 500 });
    }
    try {
      const body = new Uint8Array(await request.arrayBuffer());
      const fingerprint = await sha256Hex(action.val.prefix, body);
      const next = exchange.step(Date.now(), { tag: "body-hashed", val: fingerprint });
      if (next.tag !== "run-batch") return new Response(next.tag, { status: 500 });
      return new Response(`{"ok":true,"statements":${next.val.length}}`, { status: 201, headers: { "content-type": "application/json" } });
    } finally {
      exchange.drop();
    }
  },
};
