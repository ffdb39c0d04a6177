// OpenTelemetry for the exchanges, through `@opentelemetry/api` (an optional
// peer dependency). Platform-neutral: the API module is handed over by the
// platform (Node: ./core-node.js requires it lazily, if installed; Workers:
// `import "@idempotency/ledger/opentelemetry"`), never imported here.
//
// Costs nothing when it cannot record: without the API module, every
// exchange checks one module variable; with it but without a registered
// meter or tracer provider, one look-up of the global providers (cached by
// identity), and nothing is timed, hashed, allocated or recorded.
//
// The names, the same in every host (README "Observability"):
//   counter   idempotency.requests {request}     idempotency.outcome, http.request.method, http.route (when known)
//   histogram idempotency.ledger.duration s      idempotency.outcome
//   span      idempotency (internal, child of the active span)
//             idempotency.outcome, idempotency.generation (a handler ran),
//             idempotency.key_hash (a ticket exists), and with recordKeys:
//             idempotency.key, enduser.id; status ERROR for ERROR_OUTCOMES.

export const SCOPE = "@idempotency/ledger";
export const REQUESTS = "idempotency.requests";
export const LEDGER_DURATION = "idempotency.ledger.duration";
export const SPAN_NAME = "idempotency";

/** The outcomes whose span status is ERROR. */
export const ERROR_OUTCOMES = new Set(["ledger-failed", "ledger-busy", "ledger-outcome-unknown", "internal-error", "completion-failed", "fenced-out"]);

/**
 * Bucket boundaries (seconds) for the ledger's time per exchange: one to a
 * few SQLite transactions (tens of microseconds) up to network round trips
 * and lock waits (seconds).
 */
export const DURATION_BUCKETS = [0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

let api = null; // the @opentelemetry/api module, once known
let loader = null; // () => the module (throws when it is not installed)
let settled = false; // loading was tried (or the module was given)
let noop = null; // the API's no-op counter and tracer provider, to tell them apart
let instruments = null;
const cache = { meterProvider: undefined, tracerProvider: undefined };

/**
 * Uses `module` (the `@opentelemetry/api` namespace) from now on; `null`
 * turns telemetry off for the process (or isolate).
 */
export function useOpenTelemetryApi(module) {
  api = module ?? null;
  settled = true;
  noop = null;
  instruments = null;
  cache.meterProvider = undefined;
  cache.tracerProvider = undefined;
}

/** How the platform loads the API on first use (Node: a require that throws when it is not installed). */
export function setOpenTelemetryLoader(load) {
  if (!settled) loader = load;
}

function loadedApi() {
  if (settled) return api;
  settled = true;
  try {
    api = loader === null ? null : (loader() ?? null);
  } catch {
    api = null; // not installed: telemetry stays off
  }
  if (api !== null && (typeof api.metrics?.getMeterProvider !== "function" || typeof api.trace?.getTracerProvider !== "function")) api = null;
  return api;
}

/**
 * The instruments to record with now: { api, counter, histogram, tracer }
 * (counter and histogram null without a meter provider, tracer null without
 * a tracer provider), or null when nothing can record.
 */
export function currentInstruments() {
  if (!settled) loadedApi();
  if (api === null) return null;
  if (noop === null) {
    noop = {
      counter: api.createNoopMeter().createCounter(REQUESTS),
      tracerProvider: typeof api.ProxyTracerProvider === "function" ? new api.ProxyTracerProvider().getDelegate() : undefined,
    };
  }
  const meterProvider = api.metrics.getMeterProvider();
  const proxy = api.trace.getTracerProvider();
  const tracerProvider = typeof proxy.getDelegate === "function" ? proxy.getDelegate() : proxy;
  if (meterProvider !== cache.meterProvider || tracerProvider !== cache.tracerProvider) {
    cache.meterProvider = meterProvider;
    cache.tracerProvider = tracerProvider;
    instruments = makeInstruments(meterProvider, tracerProvider);
  }
  return instruments;
}

function makeInstruments(meterProvider, tracerProvider) {
  let counter = null;
  let histogram = null;
  const meter = meterProvider.getMeter(SCOPE);
  const c = meter.createCounter(REQUESTS, {
    unit: "{request}",
    description: "Requests (and idempotent calls) that reached the idempotency ledger, by the core's outcome",
  });
  if (c !== noop.counter) {
    counter = c;
    histogram = meter.createHistogram(LEDGER_DURATION, {
      unit: "s",
      description: "Wall time an exchange spent in the ledger: core calls, fingerprint hashing and database batches (not the handler, not waits)",
      advice: { explicitBucketBoundaries: DURATION_BUCKETS },
    });
  }
  const tracer = tracerProvider === noop.tracerProvider ? null : tracerProvider.getTracer(SCOPE);
  if (counter === null && tracer === null) return null;
  return { api, counter, histogram, tracer };
}

const now = () => performance.now();

/**
 * What one exchange records: the time in the ledger (enter/leave around each
 * core call, hash and batch), the span, the ticket's generation and key.
 */
export class ExchangeRecording {
  constructor(instruments, method, principal, recordKeys, { traced = true } = {}) {
    this.instruments = instruments;
    this.method = String(method).toUpperCase();
    this.principal = principal;
    this.recordKeys = recordKeys;
    this.seconds = 0;
    this.started = 0;
    this.ticket = null;
    this.span = null;
    this.context = null;
    const tracer = instruments.tracer;
    if (tracer !== null && traced) {
      const { context, trace, SpanKind } = instruments.api;
      const parent = context.active();
      this.span = tracer.startSpan(SPAN_NAME, { kind: SpanKind?.INTERNAL ?? 0 }, parent);
      this.context = trace.setSpan(parent, this.span);
    }
  }

  /** Ledger work starts. */
  enter() {
    this.started = now();
  }

  /** Ledger work ends. */
  leave() {
    this.seconds += (now() - this.started) / 1000;
  }

  /** Runs `fn` (the handler) with the exchange's span as the active span. */
  inSpan(fn) {
    if (this.context === null) return fn();
    return this.instruments.api.context.with(this.context, fn);
  }

  /**
   * Records the outcome. `route` is the route template (or a function
   * returning it, or undefined); `digest(prefix, body)` the ledger's SHA-256
   * (hex, maybe a promise) for the key hash.
   */
  async finish(outcome, route, digest, { measured = true, error } = {}) {
    const { counter, histogram } = this.instruments;
    if (counter !== null && outcome !== undefined) {
      const attributes = { "idempotency.outcome": outcome, "http.request.method": this.method };
      let template = route;
      if (typeof template === "function") {
        try {
          template = template();
        } catch {
          template = undefined;
        }
      }
      if (typeof template === "string" && template !== "") attributes["http.route"] = template;
      counter.add(1, attributes);
      if (measured) histogram.record(this.seconds, { "idempotency.outcome": outcome });
    }
    const span = this.span;
    if (span === null) return;
    try {
      if (outcome !== undefined) span.setAttribute("idempotency.outcome", outcome);
      const ticket = this.ticket;
      if (ticket !== null && span.isRecording()) {
        span.setAttribute("idempotency.generation", Number(ticket.generation));
        let hash = digest(`${ticket.principal}\n${ticket.key}`, new Uint8Array(0));
        if (typeof hash !== "string") hash = await hash;
        span.setAttribute("idempotency.key_hash", hash.slice(0, 16));
        if (this.recordKeys) span.setAttribute("idempotency.key", ticket.key);
      }
      if (this.recordKeys) {
        const who = ticket?.principal ?? this.principal;
        if (typeof who === "string" && who !== "") span.setAttribute("enduser.id", who);
      }
      const { SpanStatusCode } = this.instruments.api;
      if (error !== undefined) {
        span.recordException(error instanceof Error ? error : String(error));
        span.setStatus({ code: SpanStatusCode?.ERROR ?? 2, message: String(error?.message ?? error) });
      } else if (ERROR_OUTCOMES.has(outcome)) span.setStatus({ code: SpanStatusCode?.ERROR ?? 2, message: outcome });
    } finally {
      span.end();
    }
  }
}
