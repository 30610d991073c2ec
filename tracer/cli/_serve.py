"""``memtrace view --serve``: serve the page and answer its zoom and click queries, on 127.0.0.1 only.

For a run too big for one page: the page carries a coarse overview, and every zoom (``/api/window``)
and click (``/api/event``, ``/api/live``) is answered here by the analysed run's queries
(``analysis.view_window.RankQueries``, ``AnalysedRank.queries``; with ``part=serving``, those of the rank's
serving window, ``AnalysedRank.serving``), so zooming in always reaches exact steps. The server binds the loopback interface on a free port (or ``port``), prints its address, and
stops on Ctrl-C.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from memtrace.errors import UsageError
from memtrace.plots.view_html import build_page

HOST = "127.0.0.1"


class ViewServer(ThreadingHTTPServer):
    """The HTTP server: ``page`` at ``/``, the queries under ``/api/``."""

    daemon_threads = True

    def __init__(self, run, *, title: str | None = None, port: int = 0, max_events: int) -> None:
        self.queries = [r.queries for r in run.ranks]
        self.serving = [None if r.serving is None else r.serving.queries for r in run.ranks]
        self.title = title
        self.page = build_page(run, title=title, max_events=max_events, api=True).encode("utf-8")
        try:
            super().__init__((HOST, port), _Handler)
        except OSError as exc:
            raise UsageError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}; choose another --port") from None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"

    def answer(self, path: str, query: dict[str, list[str]]) -> dict:
        """The JSON answer of one API call; ValueError for a bad request."""

        def arg(name: str, kind=float):
            if name not in query:
                raise ValueError(f"missing {name}")
            return kind(query[name][0])

        if path not in ("/api/window", "/api/event", "/api/live"):
            raise LookupError(path)
        r = arg("rank", int)
        if not 0 <= r < len(self.queries):
            raise ValueError(f"no rank index {r}")
        q = self.queries[r]
        if query.get("part") == ["serving"]:
            q = self.serving[r]
            if q is None:
                raise ValueError(f"rank index {r} has no serving window")
        if path == "/api/window":
            return q.window(arg("x0"), arg("x1"), arg("w", lambda s: int(float(s))))
        if path == "/api/event":
            return {"event": q.event_at(arg("t_us"))}
        if path == "/api/live":
            e = arg("event", int)
            if not -1 <= e < len(q.t):
                raise ValueError(f"no event {e}")
            return q.live(e)
        raise LookupError(path)


class _Handler(BaseHTTPRequestHandler):
    server: ViewServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            return self._send(200, self.server.page, "text/html; charset=utf-8")
        try:
            body = json.dumps(self.server.answer(url.path, parse_qs(url.query)), separators=(",", ":"))
        except LookupError:
            return self._send(404, b"not found", "text/plain")
        except ValueError as exc:
            return self._send(400, str(exc).encode(), "text/plain")
        return self._send(200, body.encode(), "application/json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # quiet: one line per request is noise here
        pass


def start(run, *, title: str | None = None, port: int = 0, max_events: int) -> ViewServer:
    """A running server for the analysed run ``run`` (in a background thread); call ``shutdown()`` to stop it."""
    server = ViewServer(run, title=title, port=port, max_events=max_events)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve(run, *, title: str | None = None, port: int = 0, max_events: int) -> int:
    """Serve the analysed run ``run`` until Ctrl-C; returns the exit code (0)."""
    server = ViewServer(run, title=title, port=port, max_events=max_events)
    print(f"memtrace: serving {run.path} at {server.url} (loopback only; Ctrl-C stops it)", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("memtrace: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
