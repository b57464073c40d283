"""Command sessions: a process in a sandbox whose output streams as
server-sent events, replayed after a reconnect (docs/api.md, "Sessions")."""

from __future__ import annotations

import dataclasses
import http.client
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .errors import AirlockError, Conflict, ProtocolError, Unavailable
from .models import CommandEvent, CommandResult, Exit, compact, parse_time, seg
from .sse import EventReader

if TYPE_CHECKING:
    from .client import Client

# How Command.stream attaches again after a dropped stream: up to
# MAX_RECONNECTS attaches in a row may fail, with pauses from FIRST_BACKOFF
# doubling to MAX_BACKOFF seconds between them.
MAX_RECONNECTS = 5
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 2.0

# STDIN_CHUNK is the most one stdin post carries; the server takes up to
# 16 MiB.
STDIN_CHUNK = 8 << 20


def command_request(command: str | Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                    user: str | None = None, timeout_s: int | None = None, stdin: bool = False,
                    pty: tuple[int, int] | None = None) -> dict[str, Any]:
    """The body of POST .../commands and .../exec: a string is a shell
    command line (cmd), a sequence a program and its arguments (argv)."""
    req: dict[str, Any] = {"cmd": command} if isinstance(command, str) else {"argv": list(command)}
    req.update(compact({"env": env, "cwd": cwd, "user": user, "timeout_s": timeout_s}))
    if stdin:
        req["stdin"] = True
    if pty is not None:
        req["pty"] = {"rows": pty[0], "cols": pty[1]}
    return req


class Command:
    """A command session in a sandbox (Sandbox.start makes one).

    The process starts when the command is first attached to: by iterating
    events(), or by stream() or wait(). Attaching again replays what the
    server kept (at least the last 8 MiB of output), from the start or
    after a given event; last_event_id is the last event stream() saw.
    attach_token may be handed to a client that must not hold the API key:
    it opens this command's stream only, until attach_expires_at.
    """

    def __init__(self, client: Client, data: Mapping[str, Any]) -> None:
        self.client = client
        self.id: str = data["id"]
        self.sandbox_id: str = data.get("sandbox_id", "")
        attach = data.get("attach") or {}
        self.attach_token: str = attach.get("token", "")
        self.attach_expires_at = parse_time(attach.get("expires_at"))
        self.last_event_id: int | None = None

    def __repr__(self) -> str:
        return f"<Command {self.id} in {self.sandbox_id}>"

    @property
    def _path(self) -> str:
        return f"/v1/commands/{seg(self.id)}"

    def events(self, after: int | None = None, *, token: str | None = None) -> Iterator[CommandEvent]:
        """Attaches once and yields the command's events (start, stdout,
        stderr, gap, exit) up to its exit, or until the connection drops.
        after: replay only the events after this one (Last-Event-ID). token
        authenticates instead of the API key. Leaving the loop early closes
        the connection; the process runs on."""
        headers = {"Accept": "text/event-stream"}
        if after is not None:
            headers["Last-Event-ID"] = str(after)
        with self.client.request("GET", self._path + "/attach", headers=headers, token=token) as resp:
            for ev in EventReader(resp, last_id="" if after is None else str(after)):
                try:
                    cev = CommandEvent.from_sse(ev.id, ev.name, ev.data)
                except ValueError as e:
                    raise ProtocolError(f"command {self.id}: bad {ev.name} event {ev.data[:200]!r}: {e}") from None
                yield cev
                if cev.name == "exit":
                    return

    def stream(self, on_stdout: Callable[[bytes], Any] | None = None,
               on_stderr: Callable[[bytes], Any] | None = None, *, after: int | None = None,
               on_start: Callable[[CommandEvent], Any] | None = None) -> Exit:
        """Follows the command to its exit, starting it if it has not
        started, and returns the exit. on_stdout and on_stderr get each
        chunk of output as it comes; on_start the start event. after:
        begin after this event instead of at the start. A dropped stream
        (a lost connection, 60 s without even a ping, a 5xx) is attached
        again after the last event seen, so no output is lost or repeated;
        past MAX_RECONNECTS failed attaches in a row it raises Unavailable.
        A gap (output the server no longer kept) is passed over: events()
        shows it."""
        last, failures = after, 0
        while True:
            progressed, err = False, None
            events = self.events(after=last)
            try:
                while True:
                    try:
                        ev = next(events)
                    except StopIteration:
                        err = ProtocolError(f"command {self.id}: the stream ended before the exit event")
                        break
                    except (OSError, http.client.HTTPException) as e:
                        err = e
                        break
                    except AirlockError as e:
                        if not _retryable(e):
                            raise
                        err = e
                        break
                    progressed = True
                    last = self.last_event_id = ev.id
                    if ev.name == "start" and on_start:
                        on_start(ev)
                    elif ev.name == "stdout" and on_stdout:
                        on_stdout(ev.output)
                    elif ev.name == "stderr" and on_stderr:
                        on_stderr(ev.output)
                    elif ev.name == "exit":
                        return Exit.from_json(ev.data)
            finally:
                events.close()
            failures = 1 if progressed else failures + 1
            if failures > MAX_RECONNECTS:
                raise Unavailable(f"command {self.id}: the output stream was lost and {MAX_RECONNECTS} "
                                  f"attaches in a row failed: {err}") from err
            time.sleep(min(FIRST_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF))

    def wait(self, *, stdin: bytes | None = None, on_stdout: Callable[[bytes], Any] | None = None,
             on_stderr: Callable[[bytes], Any] | None = None, after: int | None = None) -> CommandResult:
        """stream(), collecting the output: returns the exit with stdout and
        stderr as bytes. stdin, if given, is sent once the process has
        started, then closed (the command needs stdin=True)."""
        out, err = bytearray(), bytearray()

        def to_out(b: bytes) -> None:
            out.extend(b)
            if on_stdout:
                on_stdout(b)

        def to_err(b: bytes) -> None:
            err.extend(b)
            if on_stderr:
                on_stderr(b)

        def send_stdin(_: CommandEvent) -> None:
            try:
                self.write_stdin(stdin or b"", eof=True)
            except Conflict:
                pass  # it has ended already, or closed its stdin: it takes no more

        ex = self.stream(to_out, to_err, after=after, on_start=send_stdin if stdin is not None else None)
        return CommandResult(**dataclasses.asdict(ex), stdout=bytes(out), stderr=bytes(err))

    def write_stdin(self, data: bytes, eof: bool = False) -> None:
        """Sends bytes to the process's stdin (it must have started, from a
        command made with stdin=True); eof closes its stdin after them."""
        chunks = [data[i:i + STDIN_CHUNK] for i in range(0, len(data), STDIN_CHUNK)] or [b""]
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            q = {"eof": "1"} if eof and last else None
            with self.client.request("POST", self._path + "/stdin", query=q, data=chunk):
                pass

    def close_stdin(self) -> None:
        """Closes the process's stdin."""
        self.write_stdin(b"", eof=True)

    def signal(self, name: str) -> None:
        """Sends a signal, named without SIG ("TERM", "INT"), to the
        process's group."""
        self.client.call("POST", self._path + "/signal", {"signal": name})

    def kill(self) -> None:
        """Kills the process's group (SIGKILL)."""
        self.signal("KILL")

    def resize(self, rows: int, cols: int) -> None:
        """Sets the size of the command's terminal (one started with a pty)."""
        self.client.call("POST", self._path + "/resize", {"rows": rows, "cols": cols})

    def info(self) -> dict[str, Any]:
        """Returns the command's state (see Client.get_command)."""
        return self.client.get_command(self.id)


def _retryable(e: AirlockError) -> bool:
    """Whether attaching again may help after e: no answer, or a 5xx."""
    if isinstance(e, ProtocolError):
        return False
    return e.status is None or e.status >= 500
