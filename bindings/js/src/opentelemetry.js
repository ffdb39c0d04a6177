// `import "@idempotency/ledger/opentelemetry"`: hands `@opentelemetry/api` to
// the package, for platforms where it cannot require an optional dependency
// itself (Cloudflare Workers; any bundle). On Node the package finds the API
// by itself when it is installed; importing this entry there is harmless.
// Nothing is recorded until the application registers a meter or tracer
// provider with the API.
import * as api from "@opentelemetry/api";
import { useOpenTelemetryApi } from "./telemetry.js";

useOpenTelemetryApi(api);

export { DURATION_BUCKETS, ERROR_OUTCOMES, LEDGER_DURATION, REQUESTS, SCOPE, SPAN_NAME, useOpenTelemetryApi } from "./telemetry.js";
