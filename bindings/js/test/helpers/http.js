// Requests to a Worker running in miniflare, and reading the harness's stats.
import assert from "node:assert/strict";

let counter = 0;
/** A key no other test uses. */
export const uniqueKey = (label = "k") => `${label}-${process.pid}-${++counter}-${Math.random().toString(36).slice(2, 8)}`;

export const T0 = 1_800_000_000_000;

/**
 * Sends a request; returns { status, headers, text, json, id }. `token`
 * selects the principal (tok-a -> acct-a, tok-b -> acct-b).
 */
export async function send(mf, { method = "POST", path = "/orders", key, token = "tok-a", body, headers = {}, id = uniqueKey("req"), now } = {}) {
  const h = { authorization: `Bearer ${token}`, "x-test-id": id, ...headers };
  if (key !== undefined) h["idempotency-key"] = key;
  if (now !== undefined) h["x-test-now"] = String(now);
  if (body !== undefined && !Object.keys(h).some((n) => n.toLowerCase() === "content-type")) h["content-type"] = "application/json";
  const response = await mf.dispatchFetch(`http://orders.test${path}`, {
    method,
    headers: h,
    body: method === "GET" || method === "HEAD" ? undefined : body,
  });
  const bytes = new Uint8Array(await response.arrayBuffer());
  const text = new TextDecoder().decode(bytes);
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: response.status, headers: response.headers, text, bytes, json, id };
}

export const order = (sku = "A", qty = 1) => JSON.stringify({ sku, qty });

/** The harness's counters for a request id, after its waitUntil work finished. */
export async function stats(mf, id) {
  for (let i = 0; i < 200; i++) {
    const response = await mf.dispatchFetch(`http://orders.test/__stats?id=${encodeURIComponent(id)}`);
    const s = await response.json();
    if (s === null || s.waitUntil === s.waitUntilDone) return s;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.fail(`waitUntil work of ${id} never finished`);
}

/** Polls the stats until `predicate(stats)` holds (bounded). */
export async function waitFor(mf, id, predicate, what) {
  for (let i = 0; i < 500; i++) {
    const response = await mf.dispatchFetch(`http://orders.test/__stats?id=${encodeURIComponent(id)}`);
    const s = await response.json();
    if (s && predicate(s)) return s;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.fail(`timed out waiting for ${what}`);
}

export async function ledgerRow(db, principal, key) {
  return db.prepare("SELECT * FROM idempotency_keys WHERE principal = ? AND key = ?").bind(principal, key).first();
}

/** How many orders the mutation really created for a SKU (tests use a unique SKU each). */
export async function orderCount(db, sku) {
  const row = await db.prepare("SELECT COUNT(*) AS n FROM orders WHERE sku = ?").bind(sku).first();
  return row.n;
}
