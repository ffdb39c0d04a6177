"""A byte-transparent TCP proxy on loopback between a server and its
PostgreSQL: it can hold what the server sends (a flight carrying a
completion) and drop it, so the batch never reaches the database; and it
can be switched to another upstream, as a managed database's endpoint is
when a replica is promoted (failover.py)."""

from __future__ import annotations

import socket
import threading


class Proxy:
    """A TCP proxy on loopback. `hold = True` stops forwarding what clients
    send (it is buffered per connection); `drop_held()` discards it (a
    connection that closes never delivers what was held). Byte-transparent, so TLS passes through."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.hold = False
        self.held_bytes = 0
        self.held_flights = 0
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket, list[bytes]]] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                upstream = self.upstream
            try:
                server = socket.create_connection(upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            held: list[bytes] = []
            with self.lock:
                self.pairs.append((client, server, held))
            threading.Thread(target=self._pump, args=(client, server, held, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, held, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, held: list[bytes], upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    with self.lock:
                        if self.hold:
                            held.append(data)
                            self.held_bytes += len(data)
                            self.held_flights += 1
                            continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            if upstream:
                with self.lock:
                    held.clear()  # a client that went away never delivers what was held

    def switch(self, upstream_port: int, *, cut: bool = True) -> None:
        """New connections go to `upstream_port`. `cut`: the open ones are
        closed (what an endpoint does when its old server is gone); without
        it they stay on the old server (a DNS name that moved)."""
        with self.lock:
            self.upstream = ("127.0.0.1", upstream_port)
        if cut:
            self.cut()

    def cut(self) -> None:
        """Closes every open connection (both sides)."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for c, s, _ in pairs:
            for sock in (c, s):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    sock.close()
                except OSError:
                    pass

    def drop_held(self) -> None:
        with self.lock:
            for _, _, held in self.pairs:
                held.clear()
            self.hold = False

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            for c, s, _ in self.pairs:
                for sock in (c, s):
                    try:
                        sock.close()
                    except OSError:
                        pass
