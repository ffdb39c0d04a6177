// Canonical JSON for idempotent functions: the payload fingerprinted and the
// result stored. RFC 8785 (JSON Canonicalization Scheme), which is what
// JSON.stringify writes once object members are sorted:
//   - no whitespace;
//   - object members sorted by their names as UTF-16 code unit sequences
//     (JavaScript's default string order);
//   - strings escaped as JSON.stringify escapes them: `"` and `\` with a
//     backslash, U+0008 U+0009 U+000A U+000C U+000D as \b \t \n \f \r, the other
//     control characters below U+0020 as \u00xx (lowercase hex), nothing else;
//   - numbers as ECMAScript's Number-to-String (1, 1.5, -0 as 0, 1e+21, 1e-7);
//   - the text encoded as UTF-8.
// For values JSON lacks: a BigInt is its decimal digits (exact, as a Python int
// is written); bytes (an ArrayBuffer or any view on one: a Uint8Array, a Buffer,
// whose toJSON is not used) are a string of one code point per byte
// (U+0000-U+00FF, as Python's canonical_json writes `bytes`). As JSON.stringify:
// `toJSON()` is used, object members that are undefined, functions or symbols
// are left out, and in arrays they are null; undefined alone is `null`.
// Refused (TypeError): NaN and the infinities, strings with lone surrogates
// (not Unicode text), Map, Set and other collections JSON cannot hold, and
// cycles.

const encoder = new TextEncoder();

/** The canonical JSON text of `value` (see above). */
export function canonicalJson(value) {
  return write(value, "", []) ?? "null";
}

/** The canonical JSON of `value` as UTF-8 bytes. */
export function canonicalJsonBytes(value) {
  return encoder.encode(canonicalJson(value));
}

const wellFormed =
  typeof String.prototype.isWellFormed === "function"
    ? (s) => s.isWellFormed()
    : (s) => !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);

function string(s) {
  if (!wellFormed(s)) throw new TypeError("canonical JSON: a string with a lone surrogate is not Unicode text");
  return JSON.stringify(s);
}

function latin1(bytes) {
  let out = "";
  for (let i = 0; i < bytes.length; i += 8192) out += String.fromCharCode.apply(null, bytes.subarray(i, i + 8192));
  return out;
}

const NOT_JSON = [typeof Map === "function" && Map, typeof Set === "function" && Set, typeof WeakMap === "function" && WeakMap, typeof WeakSet === "function" && WeakSet, typeof Promise === "function" && Promise].filter(Boolean);

/** The JSON of `value`, or undefined for what JSON.stringify leaves out (undefined, functions, symbols). */
function write(value, key, stack) {
  // Bytes before toJSON (a Buffer's toJSON would make an object of them).
  if (value instanceof ArrayBuffer) return string(latin1(new Uint8Array(value)));
  if (ArrayBuffer.isView(value)) return string(latin1(new Uint8Array(value.buffer, value.byteOffset, value.byteLength)));
  if (value !== null && (typeof value === "object" || typeof value === "bigint") && typeof value.toJSON === "function") value = value.toJSON(key);
  switch (typeof value) {
    case "string":
      return string(value);
    case "number":
      if (!Number.isFinite(value)) throw new TypeError(`canonical JSON: ${value} is not a JSON number`);
      return String(value);
    case "boolean":
      return value ? "true" : "false";
    case "bigint":
      return value.toString();
    case "undefined":
    case "function":
    case "symbol":
      return undefined;
  }
  if (value === null) return "null";
  if (value instanceof Number || value instanceof String || value instanceof Boolean) return write(value.valueOf(), key, stack);
  for (const kind of NOT_JSON) if (value instanceof kind) throw new TypeError(`canonical JSON: a ${kind.name} is not JSON (convert it first)`);
  if (stack.includes(value)) throw new TypeError("canonical JSON: the value contains a cycle");
  stack.push(value);
  let out;
  if (Array.isArray(value)) {
    const items = [];
    for (let i = 0; i < value.length; i++) items.push(write(value[i], String(i), stack) ?? "null");
    out = `[${items.join(",")}]`;
  } else {
    const members = [];
    for (const name of Object.keys(value).sort()) {
      const item = write(value[name], name, stack);
      if (item !== undefined) members.push(`${string(name)}:${item}`);
    }
    out = `{${members.join(",")}}`;
  }
  stack.pop();
  return out;
}
