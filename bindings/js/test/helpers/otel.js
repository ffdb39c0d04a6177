// The OpenTelemetry SDK with its in-memory exporters, registered globally
// through @opentelemetry/api (as an application does), for the telemetry suites.
import * as api from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

/**
 * Registers a meter provider (delta temporality: each `metrics()` returns
 * what was recorded since the previous one) and a tracer provider, both with
 * in-memory exporters, and an AsyncLocalStorage context manager.
 */
export function installOtel({ metrics = true, traces = true } = {}) {
  const metricExporter = new InMemoryMetricExporter(AggregationTemporality.DELTA);
  const reader = new PeriodicExportingMetricReader({ exporter: metricExporter, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  const spanExporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spanExporter)] });
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  if (metrics) api.metrics.setGlobalMeterProvider(meterProvider);
  if (traces) api.trace.setGlobalTracerProvider(tracerProvider);
  return {
    api,
    tracer: tracerProvider.getTracer("test"),
    /** Every data point recorded since the last call, by instrument name: [{ attributes, value, unit }]. */
    async metrics() {
      await reader.forceFlush();
      const out = {};
      for (const rm of metricExporter.getMetrics()) {
        for (const sm of rm.scopeMetrics) {
          for (const m of sm.metrics) {
            for (const p of m.dataPoints) (out[m.descriptor.name] ??= []).push({ attributes: p.attributes, value: p.value, unit: m.descriptor.unit, scope: sm.scope.name });
          }
        }
      }
      metricExporter.reset();
      return out;
    },
    /** The spans ended since the last call. */
    spans() {
      const spans = spanExporter.getFinishedSpans();
      spanExporter.reset();
      return spans;
    },
    async shutdown() {
      api.metrics.disable();
      api.trace.disable();
      api.context.disable();
      await meterProvider.shutdown();
      await tracerProvider.shutdown();
    },
  };
}

/** The data point of `points` whose attributes are exactly `attributes`. */
export function pointWith(points, attributes) {
  return (points ?? []).find((p) => {
    const keys = Object.keys(p.attributes);
    return keys.length === Object.keys(attributes).length && keys.every((k) => p.attributes[k] === attributes[k]);
  });
}
