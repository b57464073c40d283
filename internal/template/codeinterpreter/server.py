#!/usr/bin/python3
"""airlock's server of E2B's code interpreter protocol.

It listens on 0.0.0.0:49999 (PORT) and runs code on Jupyter kernels
through jupyter_client, one kernel per context:

  GET  /health                 200 "OK" once the default context runs
  POST /execute                {code, context_id?, language?, env_vars?}:
                               200 and an NDJSON stream of
                               number_of_executions, stdout, stderr,
                               result, error, keepalive, end_of_execution
  POST /contexts               {language?, cwd?} -> {id, language, cwd}
  GET  /contexts               [{id, language, cwd}]
  DELETE /contexts/<id>        null
  POST /contexts/<id>/restart  null

Executions on one context are serialised; a client that goes away
mid-stream interrupts the kernel. Only the standard library and
jupyter_client are used.
"""

import json
import os
import queue
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

PORT = int(os.environ.get("AIRLOCK_CODE_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = "/home/user"
KEEPALIVE_SECONDS = 5
KERNEL_START_TIMEOUT = 120

os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns otherwise

# Charts come back as PNG display data, never through a GUI.
try:
    import matplotlib_inline  # noqa: F401

    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
except ImportError:
    os.environ.setdefault("MPLBACKEND", "Agg")

# Language names as E2B accepts them, and the Jupyter kernel each needs.
ALIASES = {"js": "javascript", "ts": "typescript", "py": "python", "python3": "python"}
KERNELS = {"python": "python3", "javascript": "javascript", "typescript": "javascript",
           "r": "ir", "java": "java", "bash": "bash"}

# Jupyter MIME types and the result fields E2B names them by.
MIME_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


class HTTPError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def normalise_language(language):
    lang = (language or "python").strip().lower()
    return ALIASES.get(lang, lang)


def available_kernels():
    try:
        return set(KernelSpecManager().find_kernel_specs())
    except Exception:  # noqa: BLE001
        return set()


# RESEED gives a kernel's random module (and numpy's global generator, if
# numpy is loaded already) a seed from the kernel's entropy pool, which
# the sandbox's init reseeded.
RESEED = (
    "import os as _airlock_os, random as _airlock_random, sys as _airlock_sys\n"
    "_airlock_random.seed(_airlock_os.urandom(32))\n"
    "if 'numpy' in _airlock_sys.modules:\n"
    "    _airlock_sys.modules['numpy'].random.seed(int.from_bytes(_airlock_os.urandom(4), 'little'))\n"
    "del _airlock_os, _airlock_random, _airlock_sys\n"
)


class Context:
    """A Jupyter kernel with its client; lock serialises its executions."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        kernel = KERNELS.get(language)
        # python3 is always there: jupyter_client falls back to this Python.
        have = available_kernels() | {"python3"}
        if kernel not in have:
            langs = sorted(lang for lang, k in KERNELS.items() if k in have)
            raise HTTPError(HTTPStatus.BAD_REQUEST,
                            "language %r is not supported in this sandbox: no Jupyter kernel for it "
                            "(supported: %s)" % (language, ", ".join(langs)))
        if not os.path.isdir(cwd):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "cwd %s is not a directory" % cwd)
        # A kernel started in a template snapshot lives on in every
        # sandbox cloned from it: its Python-level random state is
        # reseeded from the sandbox's own entropy before it first runs code.
        self.reseeded = False
        self.km = KernelManager(kernel_name=kernel)
        self.km.start_kernel(cwd=cwd)
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        except Exception:
            self.shutdown()
            raise

    def json(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def shutdown(self):
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)

    def restart(self):
        with self.lock:
            self.km.restart_kernel(now=True)
            self.kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)

    def run_silent(self, code, timeout=30):
        """Runs code without output and waits for the kernel to be idle."""
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"].get("execution_state") == "idle"):
                return

    def execute(self, code, env_vars, emit):
        """Runs code, calling emit(dict) for each line of the stream.

        emit raises OSError when the client went away: the kernel is then
        interrupted and the execution drained, so the next one is not
        blocked.
        """
        with self.lock:
            if not self.reseeded and self.language == "python":
                self.run_silent(RESEED)
                self.reseeded = True
            restore = None
            if env_vars and self.language == "python":
                restore = "_airlock_env_saved"
                self.run_silent(
                    "import os as _airlock_os\n"
                    "_airlock_env_saved = {k: _airlock_os.environ.get(k) for k in %r}\n"
                    "_airlock_os.environ.update(%r)\n" % (list(env_vars), dict(env_vars)))
            try:
                self._execute(code, emit)
            finally:
                if restore:
                    self.run_silent(
                        "for _k, _v in _airlock_env_saved.items():\n"
                        "    if _v is None: _airlock_os.environ.pop(_k, None)\n"
                        "    else: _airlock_os.environ[_k] = _v\n"
                        "del _airlock_env_saved, _k, _v\n")

    def _execute(self, code, emit):
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        client_gone = False
        drain_deadline = None
        last_write = time.monotonic()

        def send(line):
            nonlocal client_gone, drain_deadline, last_write
            if client_gone:
                return
            try:
                emit(line)
                last_write = time.monotonic()
            except OSError:
                client_gone = True
                drain_deadline = time.monotonic() + 10
                log("client went away: interrupting kernel", self.id)
                try:
                    self.km.interrupt_kernel()
                except Exception as e:  # noqa: BLE001
                    log("interrupt failed:", e)

        while True:
            if client_gone and time.monotonic() > drain_deadline:
                return
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not self.km.is_alive():
                    send({"type": "error", "name": "UnexpectedEndOfExecution",
                          "value": "the kernel died; it was restarted and its state is lost",
                          "traceback": ""})
                    try:
                        self.km.restart_kernel(now=True)
                        self.kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
                    except Exception as e:  # noqa: BLE001
                        log("restart after death failed:", e)
                    send({"type": "end_of_execution"})
                    return
                if time.monotonic() - last_write >= KEEPALIVE_SECONDS:
                    send({"type": "keepalive"})
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_input":
                send({"type": "number_of_executions", "execution_count": content.get("execution_count")})
            elif kind == "stream":
                send({"type": "stdout" if content.get("name") == "stdout" else "stderr",
                      "text": content.get("text", ""), "timestamp": timestamp(msg)})
            elif kind in ("execute_result", "display_data"):
                send(result(content.get("data", {}), kind == "execute_result"))
            elif kind == "error":
                send({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                      "traceback": "\n".join(content.get("traceback", []))})
            elif kind == "status" and content.get("execution_state") == "idle":
                send({"type": "end_of_execution"})
                return


def timestamp(msg):
    date = msg.get("header", {}).get("date")
    if hasattr(date, "isoformat"):
        return date.isoformat()
    if date:
        return str(date)
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


def result(data, is_main):
    out = {"type": "result", "is_main_result": is_main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
            continue
        if field == "text" and isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[field] = value
    if extra:
        out["extra"] = extra
    return out


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}  # language -> Context

    def create(self, language, cwd):
        ctx = Context(normalise_language(language), cwd or DEFAULT_CWD)
        with self.lock:
            self.by_id[ctx.id] = ctx
        log("context", ctx.id, ctx.language, "started")
        return ctx

    def default(self, language):
        language = normalise_language(language)
        with self.lock:
            ctx = self.defaults.get(language)
        if ctx is not None:
            return ctx
        ctx = self.create(language, DEFAULT_CWD)
        with self.lock:
            if language in self.defaults:  # another request made one first
                other = self.defaults[language]
                self.by_id.pop(ctx.id, None)
                threading.Thread(target=ctx.shutdown, daemon=True).start()
                return other
            self.defaults[language] = ctx
        return ctx

    def get(self, context_id):
        with self.lock:
            if context_id == "default":
                ctx = self.defaults.get("python")
            else:
                ctx = self.by_id.get(context_id)
        if ctx is None:
            raise HTTPError(HTTPStatus.NOT_FOUND, "Context %s not found" % context_id)
        return ctx

    def remove(self, context_id):
        with self.lock:
            ctx = self.by_id.pop(context_id, None)
            if ctx is None:
                raise HTTPError(HTTPStatus.NOT_FOUND, "Context %s not found" % context_id)
            for lang, d in list(self.defaults.items()):
                if d is ctx:
                    del self.defaults[lang]
        ctx.shutdown()

    def list(self):
        with self.lock:
            return [c.json() for c in self.by_id.values()]


CONTEXTS = Contexts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "airlock-code-interpreter"

    def log_message(self, fmt, *args):
        log(self.address_string(), fmt % args)

    def path_parts(self):
        path = self.path.split("?", 1)[0]
        return [p for p in path.split("/") if p]  # tolerates "//execute"

    def read_json(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if not body.strip():
            return {}
        try:
            v = json.loads(body)
        except ValueError as e:
            raise HTTPError(HTTPStatus.BAD_REQUEST, "body is not JSON: %s" % e)
        if not isinstance(v, dict):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return v

    def reply(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if content_type == "application/json" else str(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_errors(self, fn):
        try:
            fn()
        except HTTPError as e:
            self.reply(e.status, e.message, "text/plain; charset=utf-8")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001
            log("error:", repr(e))
            try:
                self.reply(HTTPStatus.INTERNAL_SERVER_ERROR, "%s: %s" % (type(e).__name__, e),
                           "text/plain; charset=utf-8")
            except OSError:
                self.close_connection = True

    def do_GET(self):
        self.handle_errors(self._get)

    def do_POST(self):
        self.handle_errors(self._post)

    def do_DELETE(self):
        self.handle_errors(self._delete)

    def _get(self):
        parts = self.path_parts()
        if parts == ["health"]:
            self.reply(HTTPStatus.OK, "OK")
        elif parts == ["contexts"]:
            self.reply(HTTPStatus.OK, CONTEXTS.list())
        else:
            raise HTTPError(HTTPStatus.NOT_FOUND, "no such path %s" % self.path)

    def _delete(self):
        parts = self.path_parts()
        if len(parts) == 2 and parts[0] == "contexts":
            CONTEXTS.remove(parts[1])
            self.reply(HTTPStatus.OK, None)
        else:
            raise HTTPError(HTTPStatus.NOT_FOUND, "no such path %s" % self.path)

    def _post(self):
        parts = self.path_parts()
        if parts == ["execute"]:
            self.execute()
        elif parts == ["contexts"]:
            req = self.read_json()
            ctx = CONTEXTS.create(req.get("language"), req.get("cwd"))
            self.reply(HTTPStatus.OK, ctx.json())
        elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            CONTEXTS.get(parts[1]).restart()
            self.reply(HTTPStatus.OK, None)
        else:
            raise HTTPError(HTTPStatus.NOT_FOUND, "no such path %s" % self.path)

    def execute(self):
        req = self.read_json()
        code = req.get("code")
        if not isinstance(code, str):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "code must be a string")
        context_id, language = req.get("context_id"), req.get("language")
        if context_id and language:
            raise HTTPError(HTTPStatus.BAD_REQUEST, "give context_id or language, not both")
        env_vars = req.get("env_vars") or {}
        if not isinstance(env_vars, dict):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "env_vars must be an object")
        ctx = CONTEXTS.get(context_id) if context_id else CONTEXTS.default(language)

        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

        def emit(line):
            data = (json.dumps(line) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            ctx.execute(code, {str(k): str(v) for k, v in env_vars.items()}, emit)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    os.makedirs(DEFAULT_CWD, exist_ok=True)
    start = time.monotonic()
    CONTEXTS.default("python")
    log("default python context ready in %.1fs (MPLBACKEND=%s)" % (time.monotonic() - start, os.environ["MPLBACKEND"]))
    server = Server(("0.0.0.0", PORT), Handler)
    log("listening on port", PORT)
    server.serve_forever()


if __name__ == "__main__":
    main()
