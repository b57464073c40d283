"""The client against a small fake server on loopback: errors, the event
stream's parsing, reconnects with Last-Event-ID, operations, and what the
requests carry. No airlock server or VM is needed."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import airlock  # noqa: E402
from airlock import Client, EventReader  # noqa: E402
from airlock import commands as commands_module  # noqa: E402

# A route answers one request: it gets the handler and writes the answer.
Route = Callable[[BaseHTTPRequestHandler], None]


class FakeServer:
    """An HTTP server on loopback whose routes the test sets, keyed by
    "METHOD /path" (without the query); it records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                path, _, query = self.path.partition("?")
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                fake.requests.append({"method": self.command, "path": path, "query": query,
                                      "headers": self.headers, "body": body})
                route = fake.routes.get(f"{self.command} {path}")
                if route is None:
                    send_json(self, 404, {"error": {"code": "not_found", "message": f"no route {path}"}})
                    return
                route(self)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send_json(h: BaseHTTPRequestHandler, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
    raw = json.dumps(body).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(raw)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(raw)


def send_raw(h: BaseHTTPRequestHandler, status: int, raw: bytes, ctype: str = "text/plain") -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(raw)))
    h.end_headers()
    h.wfile.write(raw)


def sse(event_id: int, name: str, data: Any) -> bytes:
    return f"id: {event_id}\nevent: {name}\ndata: {json.dumps(data)}\n\n".encode()


def out(event_id: int, name: str, text: bytes) -> bytes:
    return sse(event_id, name, {"data": base64.b64encode(text).decode()})


def start_stream(h: BaseHTTPRequestHandler) -> None:
    """Begins an event stream that ends with the connection."""
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Connection", "close")
    h.end_headers()
    h.close_connection = True


class OneByteAtATime(io.RawIOBase):
    """A stream that yields one byte per read, so that every line end
    falls across reads."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        b, self.data = self.data[:1], self.data[1:]
        return b


class EventReaderTest(unittest.TestCase):
    def test_parsing(self) -> None:
        cases = {
            "LF": (b"id: 1\nevent: start\ndata: {}\n\n", [("1", "start", "{}")]),
            "CRLF": (b"id: 2\r\nevent: stdout\r\ndata: a\r\n\r\n", [("2", "stdout", "a")]),
            "CR": (b"id: 3\revent: x\rdata: a\r\r", [("3", "x", "a")]),
            "comments and pings": (b": ping\n\n:x\nevent: e\n: mid\ndata: d\n\n", [("", "e", "d")]),
            "data lines joined": (b"data: a\ndata:b\ndata\n\n", [("", "message", "a\nb\n")]),
            "no data, no event": (b"id: 7\nevent: nothing\n\nevent: e\ndata: d\n\n", [("7", "e", "d")]),
            "cut off at the end": (b"event: e\ndata: d\n\nevent: f\ndata: cut", [("", "e", "d")]),
            "id with NUL ignored": (b"id: 4\ndata: a\n\nid: 5\x006\ndata: b\n\n", [("4", "message", "a"), ("4", "message", "b")]),
            "id carries on": (b"id: 9\ndata: a\n\ndata: b\n\n", [("9", "message", "a"), ("9", "message", "b")]),
            "space kept after the first": (b"data:  two\n\n", [("", "message", " two")]),
        }
        for name, (raw, want) in cases.items():
            for how, stream in (("whole", io.BytesIO(raw)), ("byte by byte", OneByteAtATime(raw))):
                with self.subTest(name, how=how):
                    got = [(e.id, e.name, e.data) for e in EventReader(stream)]  # type: ignore[arg-type]
                    self.assertEqual(got, want)

    def test_last_id(self) -> None:
        r = EventReader(io.BytesIO(b"data: a\n\nid: 12\n\n"), last_id="3")
        self.assertEqual([e.id for e in r], ["3"])
        self.assertEqual(r.last_id, "12")


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.client = Client(self.srv.url, "alk_test", timeout=5)

    def test_configuration(self) -> None:
        with mock.patch.dict(os.environ, {"AIRLOCK_URL": self.srv.url + "/", "AIRLOCK_API_KEY": " alk_env\n"}):
            c = Client()
        self.assertEqual((c.url, c.api_key), (self.srv.url, "alk_env"))
        self.srv.routes["GET /healthz"] = lambda h: send_json(h, 200, {"status": "ok"})
        self.assertEqual(c.health(), {"status": "ok"})
        self.assertEqual(self.srv.requests[-1]["headers"]["Authorization"], "Bearer alk_env")
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(Client().url, airlock.DEFAULT_URL)

    def test_loopback_skips_proxies(self) -> None:
        self.srv.routes["GET /healthz"] = lambda h: send_json(h, 200, {"status": "ok"})
        with mock.patch.dict(os.environ, {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                                          "no_proxy": "", "NO_PROXY": ""}):
            self.assertEqual(Client(self.srv.url, "k").health(), {"status": "ok"})

    def test_errors(self) -> None:
        cases: list[tuple[str, Route, type[airlock.AirlockError], int, str, str]] = [
            ("400", lambda h: send_json(h, 400, {"error": {"code": "invalid_argument", "message": "vcpus: out of bounds"}}),
             airlock.InvalidArgument, 400, "invalid_argument", "vcpus: out of bounds"),
            ("401", lambda h: send_json(h, 401, {"error": {"code": "unauthenticated", "message": "unknown key"}}),
             airlock.Unauthenticated, 401, "unauthenticated", "unknown key"),
            ("403", lambda h: send_json(h, 403, {"error": {"code": "permission_denied", "message": "admin only"}}),
             airlock.PermissionDenied, 403, "permission_denied", "admin only"),
            ("404", lambda h: send_json(h, 404, {"error": {"code": "not_found", "message": "no sandbox sbx1"}}),
             airlock.NotFound, 404, "not_found", "no sandbox sbx1"),
            ("409", lambda h: send_json(h, 409, {"error": {"code": "conflict", "message": "sandbox is paused"}}),
             airlock.Conflict, 409, "conflict", "sandbox is paused"),
            ("413", lambda h: send_json(h, 413, {"error": {"code": "payload_too_large", "message": "over 1 MiB"}}),
             airlock.PayloadTooLarge, 413, "payload_too_large", "over 1 MiB"),
            ("500", lambda h: send_json(h, 500, {"error": {"code": "internal", "message": "boom"}}),
             airlock.InternalError, 500, "internal", "boom"),
            ("503", lambda h: send_json(h, 503, {"error": {"code": "unavailable", "message": "node down"}}),
             airlock.Unavailable, 503, "unavailable", "node down"),
            ("no error body", lambda h: send_raw(h, 502, b"Bad Gateway from a proxy"),
             airlock.AirlockError, 502, "unknown", "Bad Gateway from a proxy"),
            ("status without body", lambda h: send_raw(h, 404, b""),
             airlock.NotFound, 404, "not_found", "404"),
            ("unknown code", lambda h: send_json(h, 409, {"error": {"code": "new_code", "message": "m"}}),
             airlock.Conflict, 409, "new_code", "m"),
        ]
        for name, route, cls, status, code, message in cases:
            with self.subTest(name):
                self.srv.routes["GET /v1/sandboxes/sbx1"] = route
                with self.assertRaises(airlock.AirlockError) as cm:
                    self.client.get_sandbox("sbx1")
                e = cm.exception
                self.assertIs(type(e), cls)
                self.assertEqual((e.status, e.code), (status, code))
                self.assertIn(message, str(e))

    def test_error_details_and_retry_after(self) -> None:
        details = {"limit": "memory_mib", "max": 512, "in_use": 256, "requested": 512}
        self.srv.routes["POST /v1/sandboxes"] = lambda h: send_json(
            h, 429, {"error": {"code": "resource_exhausted", "message": "over the key's memory_mib", "details": details}},
            headers={"Retry-After": "3"})
        with self.assertRaises(airlock.ResourceExhausted) as cm:
            self.client.create_sandbox("base")
        self.assertEqual((cm.exception.details, cm.exception.retry_after), (details, 3.0))

    def test_unreachable(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        with self.assertRaises(airlock.Unavailable) as cm:
            Client(f"http://127.0.0.1:{port}", "k").health()
        self.assertIsNone(cm.exception.status)
        self.assertIn(f"127.0.0.1:{port}", str(cm.exception))

    def test_create_and_wait(self) -> None:
        sbx = {"id": "sbx1", "state": "creating", "template": {"ref": "base:latest", "digest": "sha256:ab"},
               "created_at": "2026-11-29T10:00:00.123456789Z", "expires_at": None}
        op = {"id": "op1", "kind": "create", "target_id": "sbx1", "status": "pending", "error": None,
              "created_at": "2026-11-29T10:00:00Z", "finished_at": None}
        polls = []

        def get_op(h: BaseHTTPRequestHandler) -> None:
            polls.append(h.path)
            done = len(polls) > 1
            send_json(h, 200, dict(op, status="succeeded" if done else "running",
                                   finished_at="2026-11-29T10:00:01Z" if done else None))

        self.srv.routes["POST /v1/sandboxes"] = lambda h: send_json(h, 202, {"sandbox": sbx, "operation": op})
        self.srv.routes["GET /v1/operations/op1"] = get_op
        self.srv.routes["GET /v1/sandboxes/sbx1"] = lambda h: send_json(h, 200, dict(sbx, state="running"))
        s = self.client.create_sandbox("base", timeout_s=0, metadata={"k": "v"}, idempotency_key="idem-1")
        self.assertEqual((s.id, s.state, s.template, s.template_digest), ("sbx1", "running", "base:latest", "sha256:ab"))
        self.assertEqual(s.created_at.microsecond, 123456)
        self.assertIsNone(s.expires_at)
        create = self.srv.requests[0]
        self.assertEqual(json.loads(create["body"]), {"template": "base", "timeout_s": 0, "metadata": {"k": "v"}})
        self.assertEqual(create["headers"]["Idempotency-Key"], "idem-1")
        self.assertEqual(create["headers"]["Content-Type"], "application/json")
        self.assertEqual(polls, ["/v1/operations/op1?wait_s=30"] * 2)

    def test_failed_operation(self) -> None:
        failed = {"id": "op2", "kind": "wake", "target_id": "sbx1", "status": "failed",
                  "error": {"code": "resource_exhausted", "message": "no room on the host"}}
        self.srv.routes["POST /v1/sandboxes/sbx1/wake"] = lambda h: send_json(
            h, 202, {"sandbox": {"id": "sbx1", "state": "suspended"}, "operation": dict(failed, status="pending")})
        self.srv.routes["GET /v1/operations/op2"] = lambda h: send_json(h, 200, failed)
        s = airlock.Sandbox(self.client, {"id": "sbx1", "state": "suspended"})
        with self.assertRaises(airlock.ResourceExhausted) as cm:
            s.wake()
        self.assertIn("no room on the host", str(cm.exception))
        self.assertEqual(cm.exception.operation.id, "op2")

    def test_operation_timeout(self) -> None:
        self.srv.routes["GET /v1/operations/op3"] = lambda h: send_json(
            h, 200, {"id": "op3", "kind": "suspend", "target_id": "sbx1", "status": "running"})
        with self.assertRaises(TimeoutError):
            self.client.wait_operation("op3", timeout=0.5)

    def test_files_and_queries(self) -> None:
        self.srv.routes["PUT /v1/sandboxes/sbx1/files"] = lambda h: send_raw(h, 204, b"")
        self.srv.routes["GET /v1/sandboxes/sbx1/files"] = lambda h: send_raw(h, 200, b"\x00\xff", "application/octet-stream")
        s = airlock.Sandbox(self.client, {"id": "sbx1", "state": "running"})
        s.write_file("/tmp/a b&c#d.txt", "\u00e9", mode=0o600)
        put = self.srv.requests[-1]
        self.assertEqual(put["query"], "path=%2Ftmp%2Fa+b%26c%23d.txt&mode=0600")
        self.assertEqual((put["body"], put["headers"]["Content-Type"]), ("\u00e9".encode(), "application/octet-stream"))
        self.assertEqual(s.read_file("/x"), b"\x00\xff")

    def test_watch(self) -> None:
        def events(h: BaseHTTPRequestHandler) -> None:
            start_stream(h)
            h.wfile.write(b": ping\n\nevent: state\ndata: " + json.dumps({"id": "sbx1", "state": "suspending"}).encode()
                          + b"\n\nevent: state\ndata: " + json.dumps({"id": "sbx1", "state": "suspended"}).encode() + b"\n\n")

        self.srv.routes["GET /v1/sandboxes/sbx1/events"] = events
        s = airlock.Sandbox(self.client, {"id": "sbx1", "state": "running"})
        self.assertEqual([x.state for x in s.watch()], ["suspending", "suspended"])
        self.assertEqual(s.state, "suspended")

    def test_list_pages(self) -> None:
        pages = {"": {"items": [{"id": "sbx1"}], "next_page_token": "t2"},
                 "t2": {"items": [{"id": "sbx2"}], "next_page_token": ""}}

        def route(h: BaseHTTPRequestHandler) -> None:
            q = dict(p.split("=", 1) for p in h.path.partition("?")[2].split("&") if p)
            send_json(h, 200, pages[q.get("page_token", "")])

        self.srv.routes["GET /v1/sandboxes"] = route
        got = self.client.list_sandboxes(state="running", metadata={"team": "a"})
        self.assertEqual([s.id for s in got], ["sbx1", "sbx2"])
        self.assertEqual([r["query"] for r in self.srv.requests],
                         ["state=running&metadata.team=a", "state=running&metadata.team=a&page_token=t2"])


class StreamTest(unittest.TestCase):
    def setUp(self) -> None:
        self.srv = FakeServer()
        self.addCleanup(self.srv.close)
        self.client = Client(self.srv.url, "alk_test", timeout=5)
        self.cmd = airlock.Command(self.client, {"id": "cmd1", "sandbox_id": "sbx1",
                                                 "attach": {"token": "tok", "expires_at": "2026-11-29T10:10:00Z"}})

    def test_reconnect_resumes_after_last_event(self) -> None:
        # The first attach drops after three events, the second after a
        # ping; the third carries the rest. Each must resume where the
        # last one stopped.
        streams = [
            sse(1, "start", {"pid": 7}) + out(2, "stdout", b"one\n") + out(3, "stderr", b"warn\n"),
            b": ping\n\n",
            out(4, "stdout", b"two\n") + sse(5, "exit", {"exit_code": 3, "signal": None, "timed_out": False,
                                                         "duration_ms": 12}),
        ]

        def attach(h: BaseHTTPRequestHandler) -> None:
            start_stream(h)
            h.wfile.write(streams.pop(0))
            h.wfile.flush()

        self.srv.routes["GET /v1/commands/cmd1/attach"] = attach
        with mock.patch.object(commands_module, "FIRST_BACKOFF", 0.01):
            res = self.cmd.wait()
        self.assertEqual((res.exit_code, res.stdout, res.stderr, res.duration_ms), (3, b"one\ntwo\n", b"warn\n", 12))
        self.assertEqual([r["headers"].get("Last-Event-ID") for r in self.srv.requests], [None, "3", "3"])
        self.assertEqual([r["headers"].get("Accept") for r in self.srv.requests], ["text/event-stream"] * 3)
        self.assertEqual(self.cmd.last_event_id, 5)

    def test_gives_up(self) -> None:
        def attach(h: BaseHTTPRequestHandler) -> None:
            start_stream(h)

        self.srv.routes["GET /v1/commands/cmd1/attach"] = attach
        with mock.patch.object(commands_module, "FIRST_BACKOFF", 0.001):
            with self.assertRaises(airlock.Unavailable):
                self.cmd.stream()
        self.assertEqual(len(self.srv.requests), commands_module.MAX_RECONNECTS + 1)

    def test_client_errors_are_not_retried(self) -> None:
        self.srv.routes["GET /v1/commands/cmd1/attach"] = lambda h: send_json(
            h, 409, {"error": {"code": "conflict", "message": "sandbox sbx1 is deleted"}})
        with self.assertRaises(airlock.Conflict):
            self.cmd.stream()
        self.assertEqual(len(self.srv.requests), 1)

    def test_bad_event(self) -> None:
        def attach(h: BaseHTTPRequestHandler) -> None:
            start_stream(h)
            h.wfile.write(b"id: 1\nevent: stdout\ndata: {not json\n\n")

        self.srv.routes["GET /v1/commands/cmd1/attach"] = attach
        with self.assertRaises(airlock.ProtocolError):
            self.cmd.stream()
        self.assertEqual(len(self.srv.requests), 1)

    def test_events_token_and_replay(self) -> None:
        def attach(h: BaseHTTPRequestHandler) -> None:
            start_stream(h)
            h.wfile.write(sse(7, "gap", {"dropped_events": 6}) + out(8, "stdout", b"x")
                          + sse(9, "exit", {"exit_code": None, "signal": None, "timed_out": False,
                                            "duration_ms": 1, "rolled_back": True}) + out(10, "stdout", b"never"))

        self.srv.routes["GET /v1/commands/cmd1/attach"] = attach
        evs = list(self.cmd.events(after=6, token=self.cmd.attach_token))
        self.assertEqual([(e.id, e.name) for e in evs], [(7, "gap"), (8, "stdout"), (9, "exit")])
        self.assertEqual((evs[0].data, evs[1].output, evs[0].output), ({"dropped_events": 6}, b"x", b""))
        self.assertEqual(evs[2].exit, airlock.Exit(None, None, False, 1, True))
        req = self.srv.requests[0]
        self.assertEqual((req["headers"]["Authorization"], req["headers"]["Last-Event-ID"]), ("Bearer tok", "6"))

    def test_stdin(self) -> None:
        self.srv.routes["POST /v1/commands/cmd1/stdin"] = lambda h: send_raw(h, 204, b"")
        with mock.patch.object(commands_module, "STDIN_CHUNK", 4):
            self.cmd.write_stdin(b"0123456789", eof=True)
        self.assertEqual([(r["body"], r["query"]) for r in self.srv.requests],
                         [(b"0123", ""), (b"4567", ""), (b"89", "eof=1")])


if __name__ == "__main__":
    unittest.main()
