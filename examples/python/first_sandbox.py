#!/usr/bin/env python3
"""A first airlock sandbox, with nothing but Python's standard library.

Creates a sandbox, runs a command in it and streams its output over
server-sent events, writes a file and reads it back, and deletes the sandbox.

    AIRLOCK_URL       the server (default http://127.0.0.1:7700)
    AIRLOCK_API_KEY   an API key; else the admin key is read from
                      $AIRLOCK_HOME/admin.key (default /var/lib/airlock)
    AIRLOCK_TEMPLATE  the template to start from (default base)

Exits 0 when every step worked, else prints what failed and exits 1.
"""

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BASE_URL = os.environ.get("AIRLOCK_URL", "http://127.0.0.1:7700").rstrip("/")
TEMPLATE = os.environ.get("AIRLOCK_TEMPLATE", "base")
OPERATION_DEADLINE_S = 600  # how long to wait for a create or delete in all
WAIT_S = 30  # how long one GET /v1/operations/{id} may hold the request


class Failure(Exception):
    """A step did not do what it should."""


def api_key():
    key = os.environ.get("AIRLOCK_API_KEY", "").strip()
    if key:
        return key
    home = os.environ.get("AIRLOCK_HOME", "/var/lib/airlock")
    path = os.path.join(home, "admin.key")
    try:
        with open(path) as f:
            key = f.read().strip()
    except OSError as e:
        raise Failure(f"no API key: set AIRLOCK_API_KEY or make {path} readable ({e})")
    if not key:
        raise Failure(f"no API key: {path} is empty")
    return key


KEY = None  # set in main


def request(method, path, body=None, data=None, token=None, headers=None, timeout=60):
    """Sends one request and returns the response object (the caller reads
    and closes it). A JSON body goes in body, raw bytes in data. An error
    status raises Failure with the server's error code and message."""
    hdrs = {"Authorization": f"Bearer {token or KEY}"}
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    elif data is not None:
        hdrs["Content-Type"] = "application/octet-stream"
    hdrs.update(headers or {})
    url = path if path.startswith("http") else BASE_URL + path
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            err = json.loads(raw)["error"]
            why = f"{err['code']}: {err['message']}"
        except (ValueError, KeyError, TypeError):
            why = raw.decode(errors="replace").strip() or e.reason
        raise Failure(f"{method} {path}: HTTP {e.code}: {why}") from None
    except urllib.error.URLError as e:
        raise Failure(f"{method} {path}: cannot reach {BASE_URL}: {e.reason}") from None


def call(method, path, body=None, **kw):
    """A request whose answer is JSON (or empty, as a 204 is)."""
    with request(method, path, body=body, **kw) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def wait_operation(op):
    """Waits for an operation to finish, letting the server hold each request
    up to WAIT_S seconds, and returns it; a failed operation raises."""
    deadline = time.monotonic() + OPERATION_DEADLINE_S
    while op["status"] not in ("succeeded", "failed"):
        if time.monotonic() > deadline:
            raise Failure(f"operation {op['id']} ({op['kind']}) still {op['status']} after {OPERATION_DEADLINE_S} s")
        op = call("GET", f"/v1/operations/{op['id']}?wait_s={WAIT_S}", timeout=WAIT_S + 30)
    if op["status"] == "failed":
        err = op.get("error") or {}
        raise Failure(f"operation {op['id']} ({op['kind']}) failed: {err.get('code')}: {err.get('message')}")
    return op


def sse_events(resp):
    """Yields (event, id, data) from a text/event-stream response, line by line."""
    event, event_id, data = "", "", []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":  # a blank line ends an event
            if data:
                yield event or "message", event_id, "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):  # a comment, such as ": ping"
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


def attach(session):
    """Attaches to a command session with its token, prints the output as it
    comes, and returns (stdout, stderr, exit event)."""
    out, err = bytearray(), bytearray()
    url = session["attach"]["url"]
    with request("GET", url, token=session["attach"]["token"],
                 headers={"Accept": "text/event-stream"}, timeout=60) as resp:
        for event, event_id, data in sse_events(resp):
            payload = json.loads(data)
            if event == "start":
                print(f"    start: pid {payload['pid']}")
            elif event in ("stdout", "stderr"):
                chunk = base64.b64decode(payload["data"])
                (out if event == "stdout" else err).extend(chunk)
                print(f"    {event}: {chunk.decode(errors='replace')!r}")
            elif event == "gap":
                print(f"    gap: {payload.get('dropped_events')} events dropped")
            elif event == "exit":
                print(f"    exit: {payload}")
                return bytes(out), bytes(err), payload
    raise Failure("the attach stream ended without an exit event")


def run():
    sandbox_id = None
    deleted = False
    try:
        print(f"1. create a sandbox from template {TEMPLATE!r} at {BASE_URL}")
        created = call("POST", "/v1/sandboxes", {"template": TEMPLATE},
                       headers={"Idempotency-Key": "first-sandbox-" + os.urandom(8).hex()})
        sandbox_id = created["sandbox"]["id"]
        print(f"   sandbox {sandbox_id}, operation {created['operation']['id']}")

        print("2. wait for it to run")
        t0 = time.monotonic()
        wait_operation(created["operation"])
        sandbox = call("GET", f"/v1/sandboxes/{sandbox_id}")
        print(f"   state {sandbox['state']} after {time.monotonic() - t0:.1f} s")
        if sandbox["state"] != "running":
            raise Failure(f"sandbox {sandbox_id} is {sandbox['state']}, want running")

        print("3. create a command session")
        session = call("POST", f"/v1/sandboxes/{sandbox_id}/commands",
                       {"cmd": "echo hello from $(hostname); echo err >&2; exit 3"})
        print(f"   command {session['id']}, attach until {session['attach']['expires_at']}")

        print("4. attach and read its output")
        stdout, stderr, exit_event = attach(session)
        if exit_event.get("exit_code") != 3:
            raise Failure(f"exit code {exit_event.get('exit_code')}, want 3")
        want = f"hello from {sandbox_id}".encode()
        if want not in stdout:
            raise Failure(f"stdout {stdout!r} does not contain {want!r}")
        if b"err" not in stderr:
            raise Failure(f"stderr {stderr!r} does not contain b'err'")
        print("   exit code 3, stdout and stderr as expected")

        print("5. write a file and read it back")
        content = ("hello, file: \u00e9\u4e16\n").encode() + bytes(range(256))
        files = f"/v1/sandboxes/{sandbox_id}/files?path=" + urllib.parse.quote("/tmp/first sandbox.txt")
        with request("PUT", files + "&mode=0644", data=content) as resp:
            resp.read()
        with request("GET", files) as resp:
            back = resp.read()
        if back != content:
            raise Failure(f"read back {len(back)} bytes that differ from the {len(content)} written")
        print(f"   {len(content)} bytes match")

        print("6. delete the sandbox")
        answer = call("DELETE", f"/v1/sandboxes/{sandbox_id}")
        deleted = True
        wait_operation(answer["operation"])
        print(f"   sandbox {sandbox_id} deleted")
    finally:
        if sandbox_id and not deleted:
            print(f"cleaning up: deleting sandbox {sandbox_id}")
            try:
                wait_operation(call("DELETE", f"/v1/sandboxes/{sandbox_id}")["operation"])
            except Exception as e:  # report, but let the first error stand
                print(f"cleaning up failed: {e}", file=sys.stderr)


def main():
    global KEY
    sys.stdout.reconfigure(line_buffering=True)  # steps and errors in order, even in a log
    try:
        KEY = api_key()
        run()
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a timeout, a malformed answer: still one clear line
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
