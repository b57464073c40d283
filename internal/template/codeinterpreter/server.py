#!/usr/bin/python3
"""airlock's server of E2B's code interpreter protocol.

It listens on 0.0.0.0:49999 (PORT) and runs code in one interpreter
per context: Python (and R, where the image has IRkernel) on a Jupyter
kernel through jupyter_client; JavaScript and TypeScript in a node
process running node-driver.js beside this file; bash in a bash process.

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
mid-stream interrupts the execution. Only the standard library and
jupyter_client are used.

A driver (node-driver.js, bash) is a child process whose protocol is
fixed text: the code of a cell travels as a JSON string on a pipe
(node) or in a file that bash sources, never on a command line, and
what the child writes is read as data. A driver that dies or hangs is
replaced, losing its state, and the server goes on.
"""

import codecs
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
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
# How long an interpreter may go on after its client went away and was
# interrupted before it is replaced.
DRAIN_SECONDS = 10

os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns otherwise

# Charts come back as PNG display data, never through a GUI.
try:
    import matplotlib_inline  # noqa: F401

    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
except ImportError:
    os.environ.setdefault("MPLBACKEND", "Agg")

# Language names as E2B accepts them; the Jupyter kernel of each language
# that runs on one; and the languages a driver runs.
ALIASES = {"js": "javascript", "ts": "typescript", "py": "python", "python3": "python", "sh": "bash"}
KERNELS = {"python": "python3", "r": "ir"}
DRIVERS = ("javascript", "typescript", "bash")
NODE_DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node-driver.js")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

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
    if language is not None and not isinstance(language, str):
        raise HTTPError(HTTPStatus.BAD_REQUEST, "language must be a string")
    lang = (language or "python").strip().lower()
    return ALIASES.get(lang, lang)


def available_kernels():
    try:
        return set(KernelSpecManager().find_kernel_specs())
    except Exception:  # noqa: BLE001
        return set()


def available_languages():
    """The languages this sandbox runs, in the order they are named."""
    # python3 is always there: jupyter_client falls back to this Python.
    kernels = available_kernels() | {"python3"}
    langs = [lang for lang, k in KERNELS.items() if k in kernels]
    if shutil.which("node") and os.path.exists(NODE_DRIVER):
        langs += ["javascript", "typescript"]
    if shutil.which("bash"):
        langs.append("bash")
    return langs


def unsupported(language):
    langs = available_languages()
    aliases = {lang: [a for a, to in ALIASES.items() if to == lang] for lang in langs}
    names = ["%s (%s)" % (lang, ", ".join(aliases[lang])) if aliases[lang] else lang for lang in langs]
    return HTTPError(HTTPStatus.BAD_REQUEST,
                     "language %r is not supported in this sandbox; it runs %s" % (language, "; ".join(names)))


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


class Output:
    """The NDJSON stream of one execution.

    send writes a line; when the client has gone away it calls on_gone
    once and drops the lines after. drained is then true DRAIN_SECONDS
    later: an interpreter still running by then is replaced.
    """

    def __init__(self, emit, on_gone):
        self.emit = emit
        self.on_gone = on_gone
        self.gone_at = None
        self.last_write = time.monotonic()

    def send(self, line):
        if self.gone_at is not None:
            return
        try:
            self.emit(line)
            self.last_write = time.monotonic()
        except OSError:
            self.gone_at = time.monotonic()
            try:
                self.on_gone()
            except Exception as e:  # noqa: BLE001
                log("interrupt failed:", e)

    def keepalive(self):
        if time.monotonic() - self.last_write >= KEEPALIVE_SECONDS:
            self.send({"type": "keepalive"})

    def drained(self):
        return self.gone_at is not None and time.monotonic() > self.gone_at + DRAIN_SECONDS


def now_timestamp():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)


def r_string(text):
    """text as an R raw string literal, whatever it holds."""
    dashes = "-" * (max((len(m) for m in re.findall(r"-+", text)), default=0) + 1)
    return 'r"%s(%s)%s"' % (dashes, text, dashes)


class Context:
    """An interpreter of one language; lock serialises its executions."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        if language not in available_languages():
            raise unsupported(language)
        if not os.path.isdir(cwd):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "cwd %s is not a directory" % cwd)
        if language in KERNELS:
            self.interpreter = Kernel(language, cwd)
        elif language == "bash":
            self.interpreter = Bash(cwd)
        else:
            self.interpreter = Node(language, cwd)

    def json(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def shutdown(self):
        self.interpreter.shutdown()

    def restart(self):
        with self.lock:
            self.interpreter.restart()

    def check_env(self, env_vars):
        if self.language == "bash":
            for name in env_vars:
                if not ENV_NAME.match(name):
                    raise HTTPError(HTTPStatus.BAD_REQUEST, "env var name %r is not a bash variable name" % name)

    def execute(self, code, env_vars, emit):
        """Runs code, calling emit(dict) for each line of the stream.

        emit raises OSError when the client went away: the execution is
        then interrupted and drained, so the next one is not blocked.
        """
        with self.lock:
            self.interpreter.execute(code, env_vars, Output(emit, self.interpreter.interrupt))


class Kernel:
    """A Jupyter kernel and its client."""

    def __init__(self, language, cwd):
        self.language = language
        # A kernel started in a template snapshot lives on in every
        # sandbox cloned from it: its Python-level random state is
        # reseeded from the sandbox's own entropy before it first runs code.
        self.reseeded = False
        self.km = KernelManager(kernel_name=KERNELS[language])
        self.km.start_kernel(cwd=cwd)
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        except Exception:
            self.shutdown()
            raise

    def shutdown(self):
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)

    def restart(self):
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)

    def interrupt(self):
        log("client went away: interrupting the kernel")
        self.km.interrupt_kernel()

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

    def execute(self, code, env_vars, out):
        if not self.reseeded and self.language == "python":
            self.run_silent(RESEED)
            self.reseeded = True
        restore = None
        if env_vars and self.language == "python":
            self.run_silent(
                "import os as _airlock_os\n"
                "_airlock_env_saved = {k: _airlock_os.environ.get(k) for k in %r}\n"
                "_airlock_os.environ.update(%r)\n" % (list(env_vars), dict(env_vars)))
            restore = (
                "for _k, _v in _airlock_env_saved.items():\n"
                "    if _v is None: _airlock_os.environ.pop(_k, None)\n"
                "    else: _airlock_os.environ[_k] = _v\n"
                "del _airlock_env_saved, _k, _v\n")
        elif env_vars and self.language == "r":
            self.run_silent(
                ".airlock_env <- jsonlite::fromJSON(%s)\n"
                ".airlock_env_saved <- Sys.getenv(names(.airlock_env), unset = NA, names = TRUE)\n"
                "invisible(do.call(Sys.setenv, .airlock_env))\n" % r_string(json.dumps(env_vars)))
            restore = (
                "for (.k in names(.airlock_env_saved)) if (is.na(.airlock_env_saved[[.k]])) Sys.unsetenv(.k) "
                "else do.call(Sys.setenv, setNames(list(.airlock_env_saved[[.k]]), .k))\n"
                "suppressWarnings(rm(.airlock_env, .airlock_env_saved, .k))\n")
        try:
            self._execute(code, out)
        finally:
            if restore:
                self.run_silent(restore)

    def _execute(self, code, out):
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        while True:
            if out.drained():
                return
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not self.km.is_alive():
                    out.send({"type": "error", "name": "UnexpectedEndOfExecution",
                              "value": "the kernel died; it was restarted and its state is lost",
                              "traceback": ""})
                    try:
                        self.restart()
                    except Exception as e:  # noqa: BLE001
                        log("restart after death failed:", e)
                    out.send({"type": "end_of_execution"})
                    return
                out.keepalive()
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "execute_input":
                out.send({"type": "number_of_executions", "execution_count": content.get("execution_count")})
            elif kind == "stream":
                out.send({"type": "stdout" if content.get("name") == "stdout" else "stderr",
                          "text": content.get("text", ""), "timestamp": timestamp(msg)})
            elif kind in ("execute_result", "display_data"):
                # IRkernel shows the value of each visible expression as
                # display data: those that are not pictures are the
                # cell's results, as execute_result is in Python.
                data = content.get("data", {})
                main = kind == "execute_result" or (
                    self.language == "r" and not any(m.startswith("image/") for m in data))
                out.send(result(data, main))
            elif kind == "error":
                out.send({"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                          "traceback": "\n".join(content.get("traceback", []))})
            elif kind == "status" and content.get("execution_state") == "idle":
                out.send({"type": "end_of_execution"})
                return


def read_into(f, tag, events):
    """Puts (tag, bytes) on events for each read of f, then (tag, None)
    at its end; the thread running it ends with the pipe."""
    try:
        while True:
            data = os.read(f.fileno(), 65536)
            if not data:
                break
            events.put((tag, data))
    except (OSError, ValueError):
        pass
    finally:
        events.put((tag, None))


def start_reader(f, tag, events):
    threading.Thread(target=read_into, args=(f, tag, events), daemon=True).start()


class Driver:
    """A child process that runs the cells of one context.

    Its output arrives on events as (tag, bytes) from a reader thread per
    pipe, (tag, None) at a pipe's end. A subclass starts the process
    (start, which sets proc and events), sends a cell (send_cell) and
    reads its pipes (handle: returns True at the cell's end).
    """

    what = "interpreter"

    def __init__(self, cwd):
        self.cwd = cwd
        self.count = 0
        self.proc = None
        self.start()

    def stop(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log("%s %d did not end after SIGKILL" % (self.what, self.proc.pid))
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.proc = None

    def shutdown(self):
        self.stop()

    def restart(self):
        self.stop()
        self.start()

    def interrupt(self):
        log("client went away: waiting %ds for the %s" % (DRAIN_SECONDS, self.what))

    def execute(self, code, env_vars, out):
        # What came after the last cell's end (a timer's output) belongs
        # to no execution.
        try:
            while True:
                self.events.get_nowait()
        except queue.Empty:
            pass
        self.count += 1
        out.send({"type": "number_of_executions", "execution_count": self.count})
        self.begin()
        try:
            self.send_cell(code, env_vars)
        except OSError as e:
            log("%s: sending the cell failed: %s" % (self.what, e))
        while True:
            if out.drained():
                log("%s still running after the client went away: replacing it" % self.what)
                self.restart()
                return
            try:
                tag, data = self.events.get(timeout=1)
            except queue.Empty:
                out.keepalive()
                continue
            if data is None:
                self.died(out)
                return
            if self.handle(tag, data, out):
                out.send({"type": "end_of_execution"})
                return

    def died(self, out):
        status = self.proc.wait() if self.proc else None
        out.send({"type": "error", "name": "UnexpectedEndOfExecution",
                  "value": "the %s ended (exit status %s); a new one was started and the context's state is lost"
                  % (self.what, status), "traceback": ""})
        try:
            self.restart()
        except Exception as e:  # noqa: BLE001
            log("restart of the %s failed: %s" % (self.what, e))
        out.send({"type": "end_of_execution"})


class Node(Driver):
    """node running node-driver.js: cells go as JSON lines on a pipe, and
    events come back as JSON lines on another."""

    what = "node interpreter"

    def __init__(self, language, cwd):
        self.language = language
        super().__init__(cwd)

    def start(self):
        req_r, req_w = os.pipe()
        ev_r, ev_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                ["node", NODE_DRIVER, self.language, str(req_r), str(ev_w)], cwd=self.cwd,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(req_r, ev_w), start_new_session=True)
        except Exception:
            for fd in (req_r, req_w, ev_r, ev_w):
                os.close(fd)
            raise
        os.close(req_r)
        os.close(ev_w)
        self.requests = os.fdopen(req_w, "wb")
        self.event_pipe = os.fdopen(ev_r, "rb")
        self.events = queue.Queue()
        self.partial = b""
        start_reader(self.event_pipe, "events", self.events)
        start_reader(self.proc.stdout, "stdout", self.events)
        start_reader(self.proc.stderr, "stderr", self.events)

    def stop(self):
        if self.proc is None:
            return
        for f in (self.requests, self.event_pipe):
            try:
                f.close()
            except OSError:
                pass
        super().stop()

    def begin(self):
        self.partial = b""

    def send_cell(self, code, env_vars):
        self.requests.write(json.dumps({"code": code, "env": env_vars}).encode() + b"\n")
        self.requests.flush()

    def handle(self, tag, data, out):
        if tag != "events":
            # A child process of a cell writing to the inherited stdout
            # or stderr.
            out.send({"type": tag, "text": data.decode("utf-8", "replace"), "timestamp": now_timestamp()})
            return False
        self.partial += data
        *lines, self.partial = self.partial.split(b"\n")
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                log("node driver: not JSON: %r" % line[:200])
                continue
            kind = ev.get("type")
            if kind in ("stdout", "stderr"):
                out.send({"type": kind, "text": str(ev.get("text", "")), "timestamp": now_timestamp()})
            elif kind == "result":
                data = ev.get("data")
                out.send(result(data if isinstance(data, dict) else {}, True))
            elif kind == "error":
                out.send({"type": "error", "name": str(ev.get("name", "")), "value": str(ev.get("value", "")),
                          "traceback": str(ev.get("traceback", ""))})
            elif kind == "done":
                return True
        return False


class Bash(Driver):
    """A bash reading commands from a pipe. A cell is written to a file
    that bash sources, stdin from /dev/null, so that the context keeps
    its working directory, variables and functions; a fixed command then
    prints a mark with the cell's exit status on stdout and on stderr,
    after which the cell's output on each has been read."""

    what = "shell"

    def __init__(self, cwd):
        self.dir = tempfile.mkdtemp(prefix="airlock-bash-")
        self.mark = ("\x1eairlock-%s:" % uuid.uuid4().hex).encode()
        super().__init__(cwd)

    def start(self):
        env = dict(os.environ, TERM="dumb")
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=self.cwd, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.events = queue.Queue()
        start_reader(self.proc.stdout, "stdout", self.events)
        start_reader(self.proc.stderr, "stderr", self.events)
        # SIGINT (a client that went away) ends the cell's foreground
        # command, not the shell.
        self.proc.stdin.write(b"trap : INT\n")
        self.proc.stdin.flush()

    def shutdown(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def interrupt(self):
        log("client went away: interrupting the shell")
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGINT)

    def begin(self):
        self.pending = {"stdout": b"", "stderr": b""}
        self.decoders = {tag: codecs.getincrementaldecoder("utf-8")("replace") for tag in self.pending}
        self.status = {}
        self.stderr_tail = ""

    def send_cell(self, code, env_vars):
        names = sorted(env_vars)
        pre = post = ""
        if names:
            pre = "__airlock_saved_env=$(declare -p %s 2>/dev/null)\nexport %s\n" % (
                " ".join(names), " ".join("%s=%s" % (n, shlex.quote(env_vars[n])) for n in names))
            post = "unset %s\neval \"$__airlock_saved_env\"\nunset __airlock_saved_env\n" % " ".join(names)
        for name, text in (("pre.sh", pre), ("cell.sh", code), ("post.sh", post)):
            with open(os.path.join(self.dir, name), "w", encoding="utf-8", errors="replace") as f:
                f.write(text)
        mark = self.mark.decode().replace("\x1e", "\\036")
        line = (". {d}/pre.sh; {{ . {d}/cell.sh; }} </dev/null; __airlock_status=$?; . {d}/post.sh; "
                "printf '{m}%d\\n' \"$__airlock_status\"; printf '{m}%d\\n' \"$__airlock_status\" >&2\n"
                ).format(d=self.dir, m=mark)
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()

    def handle(self, tag, data, out):
        buf = self.pending[tag] + data
        i = buf.find(self.mark)
        if i >= 0:
            end = buf.find(b"\n", i)
            if end < 0:
                self.pending[tag] = buf  # the status is still on its way
                return False
            self.emit(tag, buf[:i], out, final=True)
            digits = buf[i + len(self.mark):end]
            self.status[tag] = int(digits) if digits.isdigit() else -1
            self.pending[tag] = b""
        else:
            # Hold back what may be the start of the mark.
            keep = 0
            for n in range(min(len(self.mark) - 1, len(buf)), 0, -1):
                if self.mark.startswith(buf[-n:]):
                    keep = n
                    break
            self.emit(tag, buf[:len(buf) - keep], out)
            self.pending[tag] = buf[len(buf) - keep:]
        if len(self.status) < 2:
            return False
        status = self.status["stdout"]
        if status != 0:
            tail = self.stderr_tail.splitlines()[-20:]
            out.send({"type": "error", "name": "CommandExitError", "value": "exit status %d" % status,
                      "traceback": "\n".join(tail + ["exit status %d" % status])})
        return True

    def emit(self, tag, data, out, final=False):
        text = self.decoders[tag].decode(data, final)
        if not text:
            return
        if tag == "stderr":
            self.stderr_tail = (self.stderr_tail + text)[-8192:]
        out.send({"type": tag, "text": text, "timestamp": now_timestamp()})


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
        if cwd is not None and not isinstance(cwd, str):
            raise HTTPError(HTTPStatus.BAD_REQUEST, "cwd must be a string")
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

    def shutdown_all(self):
        with self.lock:
            contexts = list(self.by_id.values())
            self.by_id.clear()
            self.defaults.clear()
        for ctx in contexts:
            try:
                ctx.shutdown()
            except Exception as e:  # noqa: BLE001
                log("shutdown of context", ctx.id, "failed:", e)


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
        env_vars = {str(k): str(v) for k, v in env_vars.items()}
        ctx = CONTEXTS.get(context_id) if context_id else CONTEXTS.default(language)
        ctx.check_env(env_vars)

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
            ctx.execute(code, env_vars, emit)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client that went away between requests
        super().handle_error(request, client_address)


def terminate(signum, frame):
    """Ends the interpreters with the server: an R kernel, unlike
    Python's, does not notice that its parent is gone."""
    log("signal %d: shutting down the contexts" % signum)
    CONTEXTS.shutdown_all()
    os._exit(0)


def main():
    signal.signal(signal.SIGTERM, terminate)
    os.makedirs(DEFAULT_CWD, exist_ok=True)
    start = time.monotonic()
    CONTEXTS.default("python")
    log("default python context ready in %.1fs (MPLBACKEND=%s)" % (time.monotonic() - start, os.environ["MPLBACKEND"]))
    server = Server(("0.0.0.0", PORT), Handler)
    log("listening on port", PORT)
    server.serve_forever()


if __name__ == "__main__":
    main()
