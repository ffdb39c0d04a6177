// `@idempotency/ledger/testing` (Node, better-sqlite3): test your own protected handlers.
import type { IdempotencyOptions, Outcome } from "./common.js";
import type { Database } from "./node.js";

/** 2030-01-01T00:00:00Z, the default start of a test clock. */
export declare const TEST_EPOCH: number;

export interface TestClock {
  /** Integer ms since the epoch: pass as the `now` option. */
  now(): number;
  /** Moves the clock forward; returns the new time. */
  advance(ms: number): number;
  /** Sets the clock; returns it. */
  set(ms: number): number;
}

/** A clock starting at `start` that runs with real time (unless `frozen`) and jumps with advance(). */
export declare function testClock(options?: { start?: number; frozen?: boolean }): TestClock;

export interface TestLedger<O> {
  /** The settings given plus db, now, onOutcome, logger and sweep: false; pass to the adapter as they are. */
  readonly options: O & { db: Database; now: () => number; onOutcome: (outcome: Outcome) => void; sweep: boolean };
  readonly db: Database;
  readonly clock: TestClock;
  /** Every outcome so far, in order. */
  readonly outcomes: Outcome[];
  /** The core's log lines. */
  readonly logs: Array<{ level: "error" | "warn" | "info"; message: string }>;
  count(outcome: Outcome): number;
  rows(): Array<Record<string, unknown>>;
  row(principal: string, key: string): Record<string, unknown> | undefined;
  /** Sweeps every row older than the retention at the clock's now; the rows deleted. */
  sweep(): Promise<number>;
  close(): void;
}

/** An in-memory SQLite ledger with a test clock, recording outcomes and log lines. */
export declare function createTestLedger<O extends IdempotencyOptions & Record<string, unknown>>(settings?: O & { clock?: TestClock }): TestLedger<O>;

/** Calls send(i) n times at once; the results in order, a thrown error in its place. */
export declare function fireDuplicates<T>(n: number, send: (i: number) => T | Promise<T>): Promise<Array<T | Error>>;

/** Serves a node:http listener (an Express app) on 127.0.0.1 and a free port. */
export declare function listen(listener: ((req: any, res: any) => void) | object): Promise<{ url: string; server: any; close(): Promise<void> }>;
