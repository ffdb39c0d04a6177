// The harness Worker (test/fixtures/harness.js: the example Worker with test
// controls, over the real D1 binding wrapped to count round trips) in real
// workerd for a test file.
import { join } from "node:path";
import { after } from "node:test";
import { PACKAGE_ROOT, startWorker } from "./workerd.js";

export const HARNESS_SCRIPT = join(PACKAGE_ROOT, "test/fixtures/harness.js");

/** Starts the harness with a fresh local D1, disposed of after the calling file's tests: `{ mf, db }`. */
export async function startHarness() {
  const worker = await startWorker({ scriptPath: HARNESS_SCRIPT });
  after(() => worker.mf.dispose());
  return worker;
}
