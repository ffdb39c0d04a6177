// A worker thread that, round after round, opens a new ledger file the moment
// every worker is ready for that round (the workers of one server starting
// together), and reports how each opening went.
import { parentPort, workerData } from "node:worker_threads";
import "better-sqlite3"; // loaded before the first gate, so the openings start together
import { openLedgerDatabase } from "../../src/node.js";

const { paths, gate, workers } = workerData;
const arrived = new Int32Array(gate);
const outcomes = [];
for (const [round, path] of paths.entries()) {
  Atomics.add(arrived, round, 1);
  while (Atomics.load(arrived, round) < workers) Atomics.wait(arrived, round, Atomics.load(arrived, round), 1);
  try {
    const db = await openLedgerDatabase(path);
    db.close();
    outcomes.push({ round, opened: true });
  } catch (error) {
    outcomes.push({ round, opened: false, error: `${error.code}: ${error.message}` });
  }
}
parentPort.postMessage(outcomes);
