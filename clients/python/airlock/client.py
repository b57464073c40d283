"""The client of one airlock server: its HTTP calls, operations, and the
calls that are not about one sandbox."""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, BinaryIO, Iterable, Iterator, Mapping

from .errors import AirlockError, ProtocolError, Unavailable, error_for
from .models import Operation, compact, id_of, seg
from .sandbox import Checkpoint, Sandbox

DEFAULT_URL = "http://127.0.0.1:7700"

# WAIT_S is how long one GET /v1/operations/{id} may hold the request.
WAIT_S = 30


class Client:
    """A client of one airlock server.

    url defaults to $AIRLOCK_URL, else http://127.0.0.1:7700; api_key to
    $AIRLOCK_API_KEY. timeout (seconds) bounds each wait for the server's
    bytes; an event stream may stay silent that long before it is taken for
    dropped (the server sends a comment at least every 15 s). It is safe to
    use from several threads.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout: float = 60.0) -> None:
        self.url = (url or os.environ.get("AIRLOCK_URL") or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("AIRLOCK_API_KEY", "")
        self.api_key = key.strip()
        self.timeout = timeout
        handlers = [] if not _is_loopback(self.url) else [urllib.request.ProxyHandler({})]
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- HTTP ---------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
                body: Any = None, data: bytes | BinaryIO | Iterable[bytes] | None = None,
                headers: Mapping[str, str] | None = None, token: str | None = None,
                timeout: float | None = None) -> http.client.HTTPResponse:
        """Sends one request and returns the response, which the caller
        reads and closes. A JSON body goes in body, raw bytes (or a binary
        file, sent as it is read) in data. token authenticates instead of
        the API key. An answer other than 2xx raises the AirlockError of its
        code; a server that cannot be reached raises Unavailable."""
        hdrs = {}
        if token or self.api_key:
            hdrs["Authorization"] = f"Bearer {token or self.api_key}"
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        elif data is not None:
            hdrs["Content-Type"] = "application/octet-stream"
        hdrs.update(headers or {})
        url = self.url + path
        if query:
            items = query.items() if isinstance(query, Mapping) else query
            url += "?" + urllib.parse.urlencode([(k, v) for k, v in items if v is not None])
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            return self._opener.open(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            with e:
                raise _http_error(method, path, e) from None
        except urllib.error.URLError as e:
            raise Unavailable(f"cannot reach the airlock server at {self.url}: {e.reason}; "
                              "is `airlock serve` running? (set AIRLOCK_URL)", status=None) from e

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """A request whose answer is JSON, returned decoded (None when empty,
        as a 204 is)."""
        with self.request(method, path, body=body, **kw) as resp:
            raw = resp.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ProtocolError(f"{method} {path}: the answer is not JSON: {raw[:200]!r}") from None

    def list_all(self, path: str, query: Mapping[str, Any] | None = None, page_size: int | None = None) -> Iterator[dict]:
        """Yields every item of a paged list, one page after the other."""
        q = dict(query or {})
        if page_size:
            q["limit"] = page_size
        while True:
            page = self.call("GET", path, query=q)
            yield from page.get("items") or []
            token = page.get("next_page_token")
            if not token:
                return
            q["page_token"] = token

    # -- operations ---------------------------------------------------------

    def get_operation(self, op_id: str, wait_s: int = 0) -> Operation:
        """Returns an operation. With wait_s > 0 the server holds the answer
        until the operation finishes or wait_s seconds (at most 60) pass."""
        q = {"wait_s": wait_s} if wait_s > 0 else None
        return Operation.from_json(self.call("GET", f"/v1/operations/{seg(op_id)}", query=q,
                                             timeout=max(self.timeout, wait_s + 30)))

    def wait_operation(self, op: Operation | str, timeout: float | None = 600) -> Operation:
        """Waits until an operation has finished and returns it; a failed one
        raises the AirlockError of its code, with .operation set. timeout
        (seconds, None for no end) raises TimeoutError when it passes."""
        if isinstance(op, str):
            op = self.get_operation(op)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not op.done:
            wait_s = WAIT_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"operation {op.id} ({op.kind}) is still {op.status} after {timeout} s")
                wait_s = max(1, min(WAIT_S, int(left)))
            op = self.get_operation(op.id, wait_s=wait_s)
        if op.status == "failed":
            err = op.error or {}
            raise error_for(err.get("code"), f"operation {op.id} ({op.kind} of {op.target_id}) failed: "
                            f"{err.get('message') or 'no reason given'}", operation=op)
        return op

    # -- sandboxes ----------------------------------------------------------

    def create_sandbox(self, template: str | None = "base", *, checkpoint: str | Checkpoint | None = None,
                       vcpus: int | None = None, memory_mib: int | None = None, disk_mib: int | None = None,
                       timeout_s: int | None = None, on_timeout: str | None = None,
                       env: Mapping[str, str] | None = None, metadata: Mapping[str, str] | None = None,
                       network: Mapping[str, Any] | None = None, idle_s: int | None = None,
                       on_idle: str | None = None, wait: bool = True, wait_timeout: float | None = 600,
                       idempotency_key: str | None = None) -> Sandbox:
        """Creates a sandbox from a template, or from a checkpoint (then the
        template is the checkpoint's), and with wait (the default) waits
        until it runs. The fields are those of POST /v1/sandboxes; None
        leaves one to the server's default. A create that fails raises the
        error of its operation; the sandbox is then left failed, to delete."""
        if checkpoint is not None:
            template = None
        req = {"template": template, "checkpoint": id_of(checkpoint), "vcpus": vcpus, "memory_mib": memory_mib,
               "disk_mib": disk_mib, "timeout_s": timeout_s, "on_timeout": on_timeout, "env": env,
               "metadata": metadata, "network": network, "idle_s": idle_s, "on_idle": on_idle}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        ans = self.call("POST", "/v1/sandboxes", compact(req), headers=headers)
        sbx = Sandbox(self, ans["sandbox"])
        sbx.operation = Operation.from_json(ans["operation"])
        if wait:
            self.wait_operation(sbx.operation, timeout=wait_timeout)
            sbx.refresh()
        return sbx

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        """Returns a sandbox as it is now."""
        return Sandbox(self, self.call("GET", f"/v1/sandboxes/{seg(sandbox_id)}"))

    def list_sandboxes(self, state: str | None = None, metadata: Mapping[str, str] | None = None) -> list[Sandbox]:
        """Returns the sandboxes the key sees, of one state if given (deleted
        ones only when asked for), carrying every metadata label given."""
        q: dict[str, Any] = {"state": state}
        q.update({f"metadata.{k}": v for k, v in (metadata or {}).items()})
        return [Sandbox(self, d) for d in self.list_all("/v1/sandboxes", compact(q))]

    # -- checkpoints --------------------------------------------------------

    def get_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """Returns a checkpoint."""
        return Checkpoint(self, self.call("GET", f"/v1/checkpoints/{seg(checkpoint_id)}"))

    def list_checkpoints(self, sandbox_id: str | None = None) -> list[Checkpoint]:
        """Returns the checkpoints the key sees, of one sandbox if given,
        oldest first."""
        return [Checkpoint(self, d) for d in self.list_all("/v1/checkpoints", compact({"sandbox_id": sandbox_id}))]

    def delete_checkpoint(self, checkpoint: str | Checkpoint) -> None:
        """Deletes a checkpoint; its storage goes once no sandbox needs it."""
        self.call("DELETE", f"/v1/checkpoints/{seg(id_of(checkpoint))}")

    # -- the rest -----------------------------------------------------------

    def get_command(self, command_id: str) -> dict[str, Any]:
        """Returns a command's state: {"id", "sandbox_id", "state", "pid",
        "exit_code", "signal", "timed_out", "started_at", "finished_at"}."""
        return self.call("GET", f"/v1/commands/{seg(command_id)}")

    def health(self) -> dict[str, Any]:
        """Asks the server whether it is up ({"status": "ok"})."""
        return self.call("GET", "/healthz")


def _http_error(method: str, path: str, e: urllib.error.HTTPError) -> AirlockError:
    """The AirlockError of an answer other than 2xx."""
    raw = e.read(64 << 10)
    retry = e.headers.get("Retry-After") if e.headers else None
    try:
        retry_after = float(retry) if retry else None
    except ValueError:
        retry_after = None
    try:
        err = json.loads(raw)["error"]
        code, message, details = err["code"], err.get("message") or "", err.get("details")
    except (ValueError, KeyError, TypeError):
        text = raw.decode(errors="replace").strip()
        code, details = None, None
        message = f"{method} {path}: the airlock server answered {e.code} {e.reason}" + (f": {text[:200]}" if text else "")
    return error_for(code, message or f"{method} {path}: {e.code} {e.reason}", status=e.code,
                     details=details, retry_after=retry_after)


def _is_loopback(url: str) -> bool:
    """Whether url names this machine, which no proxy should stand in for."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
