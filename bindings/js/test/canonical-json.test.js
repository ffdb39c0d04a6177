// Canonical JSON (RFC 8785) as idempotent functions fingerprint and store it:
// the shared vectors (test/fixtures/canonical-json.json: JSON text in, the
// canonical text out, for any host), and what only JavaScript values raise.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { canonicalJson, canonicalJsonBytes } from "../src/node.js";

const { vectors } = JSON.parse(readFileSync(new URL("./fixtures/canonical-json.json", import.meta.url), "utf8"));

test("the shared vectors: JSON text parsed, then written canonically", () => {
  assert.ok(vectors.length >= 8);
  for (const v of vectors) assert.equal(canonicalJson(JSON.parse(v.input)), v.canonical, v.what);
  assert.deepEqual([...canonicalJsonBytes({ é: "日" })], [...Buffer.from('{"é":"日"}', "utf8")], "UTF-8");
});

test("values JSON lacks: BigInt as digits, bytes as one code point per byte, toJSON, undefined", () => {
  assert.equal(canonicalJson({ n: 12345678901234567890n, m: -1n }), '{"m":-1,"n":12345678901234567890}');
  assert.equal(canonicalJson(new Uint8Array([0, 65, 0xe9, 0xff])), '"\\u0000Aéÿ"');
  assert.equal(canonicalJson(Buffer.from("hi")), '"hi"');
  assert.equal(canonicalJson(new Uint8Array([1, 2, 3, 4]).buffer.slice(1, 3)), '"\\u0002\\u0003"');
  assert.equal(canonicalJson(new Uint8Array([9, 66, 67, 9]).subarray(1, 3)), '"BC"', "a view: its own bytes only");
  assert.equal(canonicalJson({ at: new Date(Date.UTC(2030, 0, 2, 3, 4, 5)) }), '{"at":"2030-01-02T03:04:05.000Z"}');
  assert.equal(canonicalJson({ b: undefined, a: () => 1, c: Symbol("s"), d: [undefined, () => 1] }), '{"d":[null,null]}');
  assert.equal(canonicalJson(undefined), "null");
  assert.equal(canonicalJson(Object.assign(Object.create({ inherited: 1 }), { own: 2 })), '{"own":2}', "own enumerable members only");
  assert.equal(canonicalJson([new Number(1.5), new String("s"), new Boolean(false)]), '[1.5,"s",false]');
  assert.equal(canonicalJson({ shared: [1], again: [1] }), '{"again":[1],"shared":[1]}', "a value seen twice is not a cycle");
});

test("refused: non-finite numbers, lone surrogates, collections, cycles", () => {
  for (const bad of [NaN, Infinity, -Infinity, { x: NaN }]) assert.throws(() => canonicalJson(bad), TypeError);
  for (const bad of ["\ud800", "a\udc00b", { "\ud83d": 1 }]) assert.throws(() => canonicalJson(bad), /lone surrogate/);
  assert.throws(() => canonicalJson(new Map([["a", 1]])), /Map is not JSON/);
  assert.throws(() => canonicalJson({ s: new Set([1]) }), /Set is not JSON/);
  const cycle = { a: 1 };
  cycle.self = cycle;
  assert.throws(() => canonicalJson(cycle), /cycle/);
});
