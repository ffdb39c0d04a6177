// Runs the example Worker locally in workerd (miniflare, offline) with a
// persisted local D1 under examples/worker/.wrangler/state, migrations applied,
// listening on 127.0.0.1:8787 until Ctrl-C:
//
//   make -C bindings/js example
//   curl -i -X POST http://127.0.0.1:8787/orders -H 'authorization: Bearer dev-token' \
//        -H 'idempotency-key: order-7f3a' -H 'content-type: application/json' -d '{"sku":"A-1","qty":2}'
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { startWorker } from "../../test/helpers/workerd.js";

const here = fileURLToPath(new URL(".", import.meta.url));
const port = Number(process.env.PORT ?? 8787);
const { mf, d1Persist } = await startWorker({
  scriptPath: join(here, "src/index.js"),
  persist: join(here, ".wrangler/state/d1"),
  bindings: { API_TOKENS: JSON.stringify({ "dev-token": "acct-dev" }) },
  port,
});
console.log(`idempotent orders Worker on ${await mf.ready} (D1 persisted in ${d1Persist}); Ctrl-C to stop`);
const stop = async () => {
  await mf.dispose();
  process.exit(0);
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
