// A chunked upload over a raw socket that stops sending as soon as the server
// answers (as curl does on an early response): a server that refuses a body
// past its cap answers while the client is still sending.
import { connect } from "node:net";

/**
 * POSTs `total` bytes chunked (64 KiB at a time, generated lazily); resolves
 * { status, sent, growth (RSS growth of this process), head (the answer's
 * head), closed (the server closed the connection within a second of
 * answering) }.
 */
export function chunkedUpload({ port, path = "/orders", headers = {}, total }) {
  return new Promise((resolve) => {
    const rss0 = process.memoryUsage().rss;
    let peak = rss0;
    const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5);
    const socket = connect(port, "127.0.0.1");
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    const frame = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from("\r\n")]);
    let sent = 0;
    let answer = "";
    let done = false;
    let closed = false;
    let timer = null;
    const finish = () => {
      if (done) return;
      done = true;
      clearInterval(sampler);
      clearTimeout(timer);
      socket.destroy();
      const m = /^HTTP\/1\.1 (\d{3})/.exec(answer);
      resolve({ status: m ? Number(m[1]) : undefined, sent, growth: peak - rss0, head: answer.split("\r\n\r\n")[0], closed });
    };
    socket.on("data", (d) => {
      answer += d.toString("latin1");
      // Once answered: wait (a second at most) for the server to close.
      if (answer.includes("\r\n\r\n") && timer === null) timer = setTimeout(finish, 1000);
    });
    const ended = () => {
      closed = answer !== "";
      setTimeout(finish, 20);
    };
    socket.on("end", ended);
    socket.on("error", ended);
    socket.on("close", ended);
    const head = Object.entries({ host: `127.0.0.1:${port}`, "transfer-encoding": "chunked", ...headers }).map(([k, v]) => `${k}: ${v}\r\n`).join("");
    socket.write(`POST ${path} HTTP/1.1\r\n${head}\r\n`);
    const pump = () => {
      while (!done && answer === "" && sent < total) {
        sent += chunk.length;
        if (!socket.write(frame)) return socket.once("drain", pump);
      }
      if (!done && answer === "" && sent >= total) socket.write("0\r\n\r\n");
    };
    pump();
  });
}
