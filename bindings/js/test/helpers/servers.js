// Real HTTP servers on loopback for the framework tests, closed after the file's tests.
import { after } from "node:test";
import { serve } from "@hono/node-server";

const servers = [];
after(async () => {
  for (const s of servers) await new Promise((resolve) => s.close(resolve));
});

/** Starts a node:http server on a free port; its base URL. */
export async function listen(server) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  servers.push(server);
  return `http://127.0.0.1:${server.address().port}`;
}

/** Serves a Hono app with @hono/node-server on a free port; its base URL. */
export async function honoServer(app) {
  return new Promise((resolve) => {
    const server = serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, (info) => {
      servers.push(server);
      resolve(`http://127.0.0.1:${info.port}`);
    });
  });
}
