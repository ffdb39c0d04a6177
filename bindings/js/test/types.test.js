// The package's TypeScript declarations compile against a typed Worker and a
// Node server (test/types/check.ts), with the pinned TypeScript.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

test("TypeScript declarations type-check the README's usage", () => {
  const root = fileURLToPath(new URL("../", import.meta.url));
  const tsc = spawnSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "test/types/tsconfig.json"], { cwd: root, encoding: "utf8" });
  assert.equal(tsc.status, 0, `tsc failed:\n${tsc.stdout}${tsc.stderr}`);
});
