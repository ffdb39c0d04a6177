// The ledger on PostgreSQL through node-postgres (`pg`): a `pg.Pool` (or
// anything with its `connect()`), the `postgres` dialect.
//
// One transaction per batch, in ONE network round trip: the batch is a
// single pg "submittable" that writes, in one corked write, the extended-
// protocol messages Parse/Bind/Describe/Execute for
//   BEGIN ISOLATION LEVEL READ COMMITTED, SET LOCAL lock_timeout, each statement, COMMIT
// and a single Sync, then reads every answer (pg's own queries each end with
// a Sync and wait for the previous one's ReadyForQuery), or, for the
// protocol's statements but the completion, the same batch as one simple
// query (below). An error the server answers aborts the transaction: the
// server skips to the Sync (or the end of the query string), the adapter
// sends ROLLBACK (a second round trip, on errors only) before the connection
// goes back to the pool.
//
// Failures are reported as the driver saw them and classified by the core:
//   database(code, message)  the server answered with an error; nothing committed
//   pool-exhausted           every pooled connection stayed busy past connectTimeoutMs
//   unreachable              no connection could be made; nothing was sent
//   outcome-unknown          the connection broke (or the backend was terminated)
//                            after the batch was sent, before COMMIT was confirmed
//   host                     a value this adapter could not convert; nothing was sent
//
// With `preparedStatements` the protocol's statements are prepared by name,
// once per connection, inside the same flight: Parse(name) then Bind(name)
// where the connection does not hold the name yet, Bind(name) alone after.
//
// Without it, a batch of the protocol's statements other than the completion
// goes as ONE simple query: `BEGIN ...; SET LOCAL ...;` the statements with
// their parameters written in as literals (pg's `escapeLiteral`, libpq's
// rules), `COMMIT`. The server parses it at once and skips the Parse, Bind
// and Describe of every statement (about a fifth of a replay's time on
// loopback). The completion stays a flight with parameters: a statement's
// text is what pg_stat_activity shows and what the server logs for a failed
// statement, and a stored response belongs in neither.
import { BatchFailure, databaseError } from "./runtime.js";

const BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED";
// One turn of the event loop, I/O included (setImmediate runs after the poll phase).
const turn = typeof setImmediate === "function" ? () => new Promise((resolve) => setImmediate(resolve)) : () => new Promise((resolve) => setTimeout(resolve, 0));
const POOL_TIMEOUT = "timeout exceeded when trying to connect"; // pg-pool's wording for a full pool

// PostgreSQL type OIDs the ledger's columns and results use.
const INTEGER_TYPES = new Set([20, 21, 23, 26]); // int8, int2, int4, oid
const REAL_TYPES = new Set([700, 701]); // float4, float8
const TEXT_TYPES = new Set([25, 1043, 1042, 19, 705]); // text, varchar, bpchar, name, unknown
const BOOL = 16;
const BYTEA = 17;

// The protocol's statements (`statement.query`) run by name with `preparedStatements`:
// a fixed set, so a connection holds a handful at most. The migration's DDL stays unnamed.
const NAMED_QUERIES = new Set(["claim", "takeover", "lookup", "complete", "release", "sweep", "renew", "fence"]);
const statementNames = new Map(); // SQL text -> its statement name, for this process

// The protocol's statements sent as one simple query: every one but the completion.
const INLINED_QUERIES = new Set([...NAMED_QUERIES].filter((query) => query !== "complete"));
const templates = new Map(); // SQL text -> its template (or null), for this process

/**
 * `sql` split at its `$n` placeholders: `{ parts: [[text, index], ...], tail,
 * params }`; null for anything the split cannot read for certain (a quote
 * left open, a backslash inside quotes, dollar quoting, a comment, a
 * semicolon), as in the Rust host.
 */
function templateOf(sql) {
  const parts = [];
  let text = "";
  let quote = null;
  for (let i = 0; i < sql.length; i++) {
    const c = sql[i];
    if (quote !== null) {
      if (c === "\\") return null;
      if (c === quote) quote = null;
      text += c;
      continue;
    }
    if (c === "'" || c === '"') {
      quote = c;
      text += c;
    } else if (c === "$") {
      let j = i + 1;
      while (j < sql.length && sql[j] >= "0" && sql[j] <= "9") j++;
      const n = Number(sql.slice(i + 1, j));
      if (j === i + 1 || !(n > 0)) return null;
      parts.push([text, n - 1]);
      text = "";
      i = j - 1;
    } else if (c === ";" || (c === "-" && sql[i + 1] === "-") || (c === "/" && sql[i + 1] === "*")) {
      return null;
    } else {
      text += c;
    }
  }
  if (quote !== null) return null;
  return { parts, tail: text, params: parts.reduce((most, [, index]) => Math.max(most, index + 1), 0) };
}

/** A parameter as a quoted literal (typed by the server from its context, as an unknown parameter is); null when it cannot be one. */
function literalOf(value, escapeLiteral) {
  switch (value.tag) {
    case "null":
      return "NULL";
    case "integer":
    case "real":
      return `'${paramOf(value)}'`;
    case "text":
      return value.val.includes("\0") ? null : escapeLiteral(value.val);
    default:
      return null; // a blob goes as the flight sends it (binary)
  }
}

/**
 * The batch as one simple query, or null: a statement other than the
 * protocol's (or the completion), a parameter a query string cannot carry
 * (a blob, a text holding NUL), a client without `escapeLiteral`.
 */
function inlinedQuery(statements, lockTimeoutMs, client) {
  if (typeof client?.escapeLiteral !== "function") return null;
  const escapeLiteral = (text) => client.escapeLiteral(text);
  let query = `${BEGIN}; SET LOCAL lock_timeout = '${lockTimeoutMs}ms'`;
  for (const statement of statements) {
    if (!INLINED_QUERIES.has(statement.query)) return null;
    let template = templates.get(statement.sql);
    if (template === undefined) templates.set(statement.sql, (template = templateOf(statement.sql)));
    if (template === null || template.params !== statement.params.length) return null;
    query += "; ";
    for (const [text, index] of template.parts) {
      const literal = literalOf(statement.params[index], escapeLiteral);
      if (literal === null) return null;
      query += text + literal;
    }
    query += template.tail;
  }
  return `${query}; COMMIT`;
}

/**
 * The name a protocol statement is prepared under: its query and a hash of
 * its text, so that every process of the same version names the same text
 * alike and a name never stands for two texts (a connection a pooler shares
 * between processes never runs another text under a name).
 */
function statementName(statement) {
  if (!NAMED_QUERIES.has(statement.query)) return "";
  let name = statementNames.get(statement.sql);
  if (name === undefined) {
    name = `idempotency_ledger_${statement.query}_${fnv1a64(statement.sql)}`;
    statementNames.set(statement.sql, name);
  }
  return name;
}

/** FNV-1a, 64 bits, over the UTF-16 code units, as 16 hex digits (two 32-bit halves, no BigInt). */
function fnv1a64(text) {
  let hi = 0xcbf29ce4, lo = 0x84222325;
  for (let i = 0; i < text.length; i++) {
    lo ^= text.charCodeAt(i);
    // (hi:lo) * 0x100000001b3 mod 2^64, in 16-bit pieces
    const l0 = lo & 0xffff, l1 = lo >>> 16, h0 = hi & 0xffff, h1 = hi >>> 16;
    let t0 = l0 * 0x1b3;
    let t1 = l1 * 0x1b3 + (t0 >>> 16);
    let t2 = h0 * 0x1b3 + (t1 >>> 16) + l0 * 0x100;
    let t3 = h1 * 0x1b3 + (t2 >>> 16) + l1 * 0x100;
    lo = ((t1 & 0xffff) << 16 | (t0 & 0xffff)) >>> 0;
    hi = ((t3 & 0xffff) << 16 | (t2 & 0xffff)) >>> 0;
  }
  return hi.toString(16).padStart(8, "0") + lo.toString(16).padStart(8, "0");
}

/**
 * What each connection holds, by statement name: `ready` (prepared: Bind
 * alone), `parsing` (the flight on the connection sends its Parse: later
 * statements of that flight Bind it alone), `uncertain` (a flight that
 * parsed it failed before the server confirmed the statement: Close, then
 * Parse again; Close of a name the server does not hold is no error). Kept per pg client (one connection for
 * its life); a client discarded by the pool takes its entry with it.
 */
const preparedOn = new WeakMap();
function preparedOf(client) {
  let names = preparedOn.get(client);
  if (!names) preparedOn.set(client, (names = new Map()));
  return names;
}

function paramOf(value) {
  switch (value.tag) {
    case "null":
      return null;
    case "integer":
      return value.val.toString();
    case "real":
      if (!Number.isFinite(value.val)) return value.val > 0 ? "Infinity" : value.val < 0 ? "-Infinity" : "NaN";
      return String(value.val);
    case "text":
      return value.val;
    case "blob":
      return Buffer.from(value.val.buffer, value.val.byteOffset, value.val.byteLength); // sent in binary format
    default:
      throw new BatchFailure({ tag: "host", val: `unknown value tag ${value.tag}` });
  }
}

function valueOf(text, field, column) {
  if (text === null || text === undefined) return { tag: "null" };
  const type = field.dataTypeID;
  if (INTEGER_TYPES.has(type)) return { tag: "integer", val: BigInt(text) };
  if (TEXT_TYPES.has(type)) return { tag: "text", val: text };
  if (REAL_TYPES.has(type)) return { tag: "real", val: Number(text) };
  if (type === BOOL) return { tag: "integer", val: text === "t" ? 1n : 0n };
  if (type === BYTEA) {
    const hex = text.startsWith("\\x") ? text.slice(2) : "";
    return { tag: "blob", val: Uint8Array.from(Buffer.from(hex, "hex")) };
  }
  // A column type the ledger never uses: the database's schema problem
  // (SQLSTATE 42804, datatype mismatch), as the Rust host reports it.
  throw new BatchFailure(databaseError("42804", `column ${column} has type oid ${type}, which the ledger never uses`));
}

/** `changes` counts rows written (as SQLite's does): the command tag's count, 0 for a SELECT. */
function changesOf(tag, sql) {
  if (/^\s*select\b/i.test(sql)) return 0n;
  const m = /(\d+)\s*$/.exec(tag ?? "");
  return m && !/^(BEGIN|SET|COMMIT)/.test(tag) ? BigInt(m[1]) : 0n;
}

const isDatabaseError = (e) => !!e && typeof e.code === "string" && /^[0-9A-Z]{5}$/.test(e.code) && typeof e.severity === "string";
/**
 * A server's error as the core's `database` failure. 26000 (a prepared
 * statement is gone) says where it comes from: this ledger's named
 * statements behind a pooler that does not keep them.
 */
function serverError(error) {
  const message =
    error.code === "26000"
      ? `${error.message} (a prepared statement this connection made is gone: behind a transaction pooler (PgBouncer pool_mode=transaction before 1.21) a named prepared statement lives on one server connection only; turn preparedStatements off there)`
      : error.message;
  return databaseError(error.code, message);
}
const isFatal = (e) => isDatabaseError(e) && (e.severity === "FATAL" || e.severity === "PANIC");
/**
 * A server error after which the connection leaves the pool: it refuses
 * writes on it (25006: a standby, as a primary that failed over becomes, or
 * read-only), or reports itself broken or shutting down (class 08,
 * 57P01-57P03). pg-pool would hand it out again and every batch would fail
 * on it; a new connection reaches whatever the URL names now.
 */
const discards = (e) => isDatabaseError(e) && (e.code === "25006" || String(e.code).startsWith("08") || ["57P01", "57P02", "57P03"].includes(e.code));

/**
 * One batch as a pg submittable: every message in one write, one Sync.
 * `resolve(results)` / `reject(BatchFailure)`; `state.sent` tells whether
 * the flight left, `state.committed` whether COMMIT's CommandComplete came.
 * `inTransaction`: the statements alone, inside a transaction already open
 * on the connection (no BEGIN, no COMMIT: a handler's completion).
 */
class Flight {
  /**
   * `prepared`: the connection's statement names (see `preparedOf`) when the
   * protocol's statements run by name, else null (every statement unnamed).
   */
  constructor(statements, lockTimeoutMs, resolve, reject, { inTransaction = false, prepared = null, simple = null } = {}) {
    this.statements = statements;
    this.texts = inTransaction ? statements.map((s) => s.sql) : [BEGIN, `SET LOCAL lock_timeout = '${lockTimeoutMs}ms'`, ...statements.map((s) => s.sql), "COMMIT"];
    this.first = inTransaction ? 0 : 2; // the index of the first statement among the texts
    this.commits = !inTransaction;
    this.results = [];
    this.current = null;
    this.index = 0;
    this.sent = false;
    this.committed = false;
    this.settled = false;
    this.resolve = resolve;
    this.reject = reject;
    this.params = statements.map((s) => s.params.map(paramOf)); // converted before anything is sent
    this.prepared = prepared;
    // The whole batch as one simple query (`inlinedQuery`), answered as the flight is: one CommandComplete per text.
    this.simple = simple;
    this.names = prepared ? statements.map(statementName) : null;
    // Names this flight parses, by the index of the statement that parses them.
    this.parsing = prepared ? new Map() : null;
  }

  /** The statement name of text `i` ("": unnamed), and whether this flight must Parse it first. */
  nameOf(i) {
    const k = i - this.first;
    if (!this.names || k < 0 || k >= this.statements.length) return ["", true];
    const name = this.names[k];
    if (!name) return ["", true];
    const state = this.prepared.get(name);
    return [name, state !== "ready" && state !== "parsing"];
  }

  submit(connection) {
    if (this.simple !== null) {
      this.sent = true;
      connection.query(this.simple);
      return;
    }
    // One write on Node's net.Socket; on Workers (pg over cloudflare:sockets,
    // which cannot cork) several writes, still sent before any answer is read.
    const stream = connection.stream;
    const corked = typeof stream?.cork === "function";
    if (corked) stream.cork();
    try {
      for (let i = 0; i < this.texts.length; i++) {
        const values = i >= this.first && i < this.first + this.statements.length ? this.params[i - this.first] : [];
        const [name, parse] = this.nameOf(i);
        if (parse) {
          if (name && this.prepared.get(name) === "uncertain") connection.close({ type: "S", name });
          connection.parse({ text: this.texts[i], name, types: [] });
          if (name) {
            this.parsing.set(i, name);
            this.prepared.set(name, "parsing");
          }
        }
        connection.bind({ statement: name, portal: "", values });
        connection.describe({ type: "P", name: "" });
        connection.execute({ portal: "", rows: 0 });
      }
      connection.sync();
    } finally {
      this.sent = true;
      if (corked) stream.uncork();
    }
  }

  handleRowDescription(msg) {
    this.current = { fields: msg.fields, rows: [] };
  }

  handleDataRow(msg) {
    if (this.settled) return;
    const fields = this.current?.fields ?? [];
    try {
      this.current.rows.push(msg.fields.map((text, i) => valueOf(text, fields[i] ?? { dataTypeID: 25 }, i)));
    } catch (error) {
      this.fail(error);
    }
  }

  handleCommandComplete(msg) {
    const i = this.index++;
    const rows = this.current?.rows ?? [];
    this.current = null;
    if (i >= this.first && i < this.first + this.statements.length) {
      this.results.push({ rows, changes: changesOf(msg.text, this.texts[i]) });
    }
    const parsed = this.parsing?.get(i);
    if (parsed !== undefined) {
      this.prepared.set(parsed, "ready"); // its statement ran: the server holds the name
      this.parsing.delete(i);
    }
    if (this.commits && i === this.texts.length - 1) this.committed = true;
  }

  handleEmptyQuery() {
    this.handleCommandComplete({ text: "" });
  }

  handlePortalSuspended() {}
  handleCopyInResponse() {}
  handleCopyData() {}

  handleReadyForQuery() {
    if (this.settled) return;
    if (this.results.length !== this.statements.length || (this.commits && !this.committed)) {
      this.fail(
        this.commits
          ? new BatchFailure({ tag: "outcome-unknown", val: "postgres: the batch ended without COMMIT being confirmed" })
          : new BatchFailure({ tag: "host", val: "postgres: the statements ended without every result" }),
      );
      return;
    }
    this.settled = true;
    this.resolve(this.results);
  }

  handleError(error) {
    this.fail(error);
  }

  fail(error) {
    if (this.settled) return;
    this.settled = true;
    this.forgetUnconfirmed(error);
    this.reject(error);
  }

  /**
   * After a failure: a name parsed by this flight whose statement did not
   * run may or may not be held by the server (its Parse may have succeeded
   * before the error); the next flight closes it first. A server that lost
   * a name this connection prepared (26000: DEALLOCATE, DISCARD ALL, a
   * pooler's other server connection) makes every name uncertain.
   */
  forgetUnconfirmed(error) {
    if (!this.prepared) return;
    for (const name of this.parsing.values()) this.prepared.set(name, "uncertain");
    this.parsing.clear();
    if (isDatabaseError(error) && error.code === "26000") {
      for (const name of this.prepared.keys()) this.prepared.set(name, "uncertain");
    }
  }
}

/**
 * The ledger over a node-postgres pool (`new pg.Pool(...)`; on Workers the
 * same code over Hyperdrive: `new pg.Pool({ connectionString:
 * env.HYPERDRIVE.connectionString })`). Options: `connectTimeoutMs` (how
 * long a batch waits for a pooled connection: then `pool-exhausted` when the
 * pool is full, `unreachable` otherwise; default 5000), `lockTimeoutMs`
 * (SET LOCAL lock_timeout per batch, default 5000: a lock held longer is
 * SQLSTATE 55P03, busy; at least 1 ms, as the Rust and Python hosts set it:
 * PostgreSQL reads 0 as "wait forever"), `preparedStatements` (default
 * false: the protocol's statements prepared by name once per connection, so
 * the server no longer parses and plans each in every batch; only on a direct
 * connection or a pooler that keeps prepared statements, as in the Rust and
 * Python hosts: behind PgBouncer before 1.21 in transaction mode a name
 * prepared on one server connection is looked for on another, and the batch
 * fails with SQLSTATE 26000).
 */
export function pgLedger(pool, { connectTimeoutMs = 5000, lockTimeoutMs = 5000, preparedStatements = false } = {}) {
  if (!pool || typeof pool.connect !== "function") throw new TypeError("pgLedger needs a pg.Pool");
  if (!Number.isSafeInteger(lockTimeoutMs) || lockTimeoutMs < 0) throw new TypeError("lockTimeoutMs must be a non-negative integer");
  if (typeof preparedStatements !== "boolean") throw new TypeError("preparedStatements must be a boolean");
  const preparedFor = preparedStatements ? preparedOf : () => null;
  lockTimeoutMs = Math.max(1, lockTimeoutMs);
  const broken = brokenClients(pool);

  async function checkout() {
    let timer;
    const pending = pool.connect();
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(POOL_TIMEOUT)), connectTimeoutMs);
    });
    try {
      return await Promise.race([pending, timeout]);
    } catch (error) {
      // A connection that arrives after we gave up goes straight back.
      pending.then((c) => c.release(), () => {});
      if (isDatabaseError(error)) throw new BatchFailure(serverError(error), { cause: error });
      const message = String(error?.message ?? error);
      const max = pool.options?.max ?? Infinity;
      if (message.includes(POOL_TIMEOUT) && (pool.totalCount ?? 0) >= max) {
        throw new BatchFailure({ tag: "pool-exhausted", val: `postgres pool: every connection (${max}) stayed busy for ${connectTimeoutMs} ms` }, { cause: error });
      }
      throw new BatchFailure({ tag: "unreachable", val: `postgres: ${message}` }, { cause: error });
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * A pooled connection that is still open. The server's goodbye to an idle
   * connection (a restart, pg_terminate_backend, an idle timeout) may sit
   * unread when the pool hands it out: two turns of the event loop let pg read
   * it (about 2 us) before anything is sent, and such a connection is dropped
   * for another. Without them, 6 of 10 runs of 20 idle terminations sent a
   * batch on a dead connection, which can only be answered "outcome unknown".
   */
  async function openClient() {
    const attempts = (pool.options?.max ?? 10) + 1;
    for (let attempt = 0; attempt < attempts; attempt++) {
      const client = await checkout();
      let lost = null;
      const onLost = (error) => {
        lost ??= error ?? new Error("the connection ended");
      };
      client.on("error", onLost);
      client.on("end", onLost);
      await turn();
      await turn();
      client.removeListener("error", onLost);
      client.removeListener("end", onLost);
      if (lost === null && broken.has(client)) lost = new Error("the connection broke while the pool handed it out");
      if (lost === null) return client;
      client.release(lost); // pg-pool discards a client released with an error
    }
    throw new BatchFailure({ tag: "unreachable", val: "postgres: every pooled connection had been closed by the server" });
  }

  async function batch(statements) {
    const client = await openClient();
    // A checked-out client that loses its connection emits 'error': keep it from crashing the process.
    const onError = () => {};
    client.on("error", onError);
    let flight;
    try {
      const results = await new Promise((resolve, reject) => {
        try {
          const simple = preparedStatements ? null : inlinedQuery(statements, lockTimeoutMs, client);
          flight = new Flight(statements, lockTimeoutMs, resolve, reject, { prepared: preparedFor(client), simple });
        } catch (error) {
          reject(error);
          return;
        }
        client.query(flight);
      });
      client.removeListener("error", onError);
      client.release();
      return results;
    } catch (error) {
      const failure = await failureOf(client, flight, error);
      client.removeListener("error", onError);
      return Promise.reject(failure);
    }
  }

  /** Classifies what the driver saw (and puts the connection back or destroys it). */
  async function failureOf(client, flight, error) {
    const sent = !!flight?.sent;
    if (error instanceof BatchFailure && !sent) {
      client.release();
      return error;
    }
    if (isDatabaseError(error) && !isFatal(error)) {
      // The server answered: the transaction is aborted (skipped to Sync); roll it back.
      try {
        await client.query("ROLLBACK");
        client.release(discards(error) ? error : undefined); // pg-pool discards a client released with an error
      } catch (rollbackError) {
        client.release(rollbackError);
      }
      return new BatchFailure(serverError(error), { cause: error });
    }
    if (error instanceof BatchFailure) {
      // A value this adapter could not convert while reading the answer: the
      // flight was sent, so its outcome is what the server did; be safe.
      client.release(error);
      return sent && error.batchError.tag !== "database"
        ? new BatchFailure({ tag: "outcome-unknown", val: error.message }, { cause: error })
        : error;
    }
    client.release(error instanceof Error ? error : new Error(String(error)));
    const what = isDatabaseError(error) ? `${error.message} (${error.code})` : String(error?.message ?? error);
    if (!sent) return new BatchFailure({ tag: "unreachable", val: `postgres: ${what}` }, { cause: error });
    // The connection broke (or the backend was terminated) after the batch left.
    return new BatchFailure({ tag: "outcome-unknown", val: `postgres: ${what}` }, { cause: error });
  }

  /** A failure inside a handler's open transaction: nothing commits before COMMIT, so a lost connection lost the transaction. */
  function inTransactionFailure(error, sent) {
    if (error instanceof BatchFailure) return error;
    if (isDatabaseError(error) && !isFatal(error)) return new BatchFailure(serverError(error), { cause: error });
    const what = isDatabaseError(error) ? `${error.message} (${error.code})` : String(error?.message ?? error);
    return new BatchFailure({ tag: sent ? "unreachable" : "host", val: `postgres: ${what}` }, { cause: error });
  }

  /**
   * Opens a transactional handler's transaction (docs/SPEC.md 10.2) on a
   * connection checked out of the pool for the request: `BEGIN ISOLATION
   * LEVEL READ COMMITTED; SET LOCAL lock_timeout`. The handler gets `handle`:
   * `{ client, dialect }`, the checked-out pg client inside the transaction;
   * the completion runs on it, then COMMIT or ROLLBACK, and only then does
   * the connection go back to the pool (a broken one is discarded). While the
   * transaction is open, the client's `release()` refuses to run.
   */
  async function begin() {
    const client = await openClient();
    const onError = () => {};
    client.on("error", onError);
    const release = client.release;
    let open = true;
    // A statement met a server that refuses this connection (`discards`): it leaves the pool after the rollback.
    let discard = null;
    const end = (error) => {
      if (!open) return;
      open = false;
      client.removeListener("error", onError);
      client.release = release;
      release.call(client, error);
    };
    try {
      await client.query(`${BEGIN}; SET LOCAL lock_timeout = '${lockTimeoutMs}ms'`);
    } catch (error) {
      end(error instanceof Error ? error : new Error(String(error)));
      if (isDatabaseError(error) && !isFatal(error)) throw new BatchFailure(serverError(error), { cause: error });
      throw new BatchFailure({ tag: "unreachable", val: `postgres: ${error?.message ?? error}` }, { cause: error });
    }
    client.release = () => {
      throw new Error("this client belongs to a transactional handler's open transaction: the ledger commits or rolls it back and then releases it");
    };
    const inside = () => {
      if (!open) throw new BatchFailure({ tag: "host", val: "the handler's transaction has ended" });
      if (typeof client.getTransactionStatus === "function" && client.getTransactionStatus() === "I") {
        throw new BatchFailure({ tag: "host", val: "the handler's transaction is no longer open on its client (the handler committed or rolled it back)" });
      }
    };
    return {
      handle: Object.freeze({ dialect: "postgres", client }),
      /** The completion inside the transaction, pipelined (one Sync; no BEGIN, no COMMIT); the first error is thrown, the transaction stays (aborted) for the rollback. */
      async execute(statements) {
        inside();
        let flight;
        try {
          return await new Promise((resolve, reject) => {
            try {
              flight = new Flight(statements, lockTimeoutMs, resolve, reject, { inTransaction: true, prepared: preparedFor(client) });
            } catch (error) {
              reject(error);
              return;
            }
            client.query(flight);
          });
        } catch (error) {
          if (discards(error)) discard = error;
          throw inTransactionFailure(error, !!flight?.sent);
        }
      },
      async commit() {
        inside();
        let result;
        try {
          result = await client.query("COMMIT");
        } catch (error) {
          if (isDatabaseError(error) && !isFatal(error)) throw new BatchFailure(serverError(error), { cause: error });
          // Sent: a connection lost now leaves the commit's outcome unknown.
          end(error instanceof Error ? error : new Error(String(error)));
          throw new BatchFailure({ tag: "outcome-unknown", val: `postgres: ${error?.message ?? error}` }, { cause: error });
        }
        if (result?.command !== "COMMIT") {
          // An aborted transaction answers COMMIT with ROLLBACK: nothing committed.
          throw new BatchFailure({ tag: "host", val: `postgres: COMMIT was answered ${result?.command}` });
        }
        end();
      },
      /** ROLLBACK, then the connection goes back to the pool (discarded when the rollback failed: the server rolls back as it goes). */
      async rollback() {
        if (!open) return;
        try {
          await client.query("ROLLBACK");
          end(discard ?? undefined);
        } catch (error) {
          end(error instanceof Error ? error : new Error(String(error)));
        }
      },
    };
  }

  return { dialect: "postgres", pool, batch, begin };
}

const BROKEN = Symbol("idempotency-ledger: clients whose connection broke");

/**
 * The pool's clients that emitted 'error', seen by an 'error' listener every
 * new client gets at its 'connect' (once per pool). pg-pool removes its own
 * listener when it hands a client out, in the same turn as a server's
 * goodbye can arrive on a fresh connection (a backend terminated right after
 * it started): without a listener of its own, that 'error' would end the
 * process. Such a client is dropped for another by `openClient`.
 */
function brokenClients(pool) {
  if (!pool[BROKEN]) {
    const broken = new WeakSet();
    pool.on("connect", (client) => client.on("error", () => broken.add(client)));
    pool[BROKEN] = broken;
  }
  return pool[BROKEN];
}

/** True for a node-postgres Pool (duck-typed). */
export function isPgPool(db) {
  return !!db && typeof db.connect === "function" && typeof db.query === "function" && "totalCount" in db;
}
