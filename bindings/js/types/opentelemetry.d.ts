// `import "@idempotency/ledger/opentelemetry"`: hands @opentelemetry/api to the
// package (Workers and bundles; on Node it is found by itself when installed).

/** The instrumentation scope of the meter and the tracer. */
export declare const SCOPE: "@idempotency/ledger";
/** Counter, unit `{request}`: attributes `idempotency.outcome`, `http.request.method`, `http.route` (when known). */
export declare const REQUESTS: "idempotency.requests";
/** Histogram, unit `s`: the ledger's wall time per exchange; attribute `idempotency.outcome`. */
export declare const LEDGER_DURATION: "idempotency.ledger.duration";
/** The span around each exchange. */
export declare const SPAN_NAME: "idempotency";
/** The outcomes whose span status is ERROR. */
export declare const ERROR_OUTCOMES: ReadonlySet<string>;
/** The histogram's advised bucket boundaries, in seconds. */
export declare const DURATION_BUCKETS: readonly number[];
/** Uses this `@opentelemetry/api` module from now on (null: record nothing). */
export declare function useOpenTelemetryApi(api: object | null): void;
