"""The API's answers as Python values, and small helpers the other modules
share."""

from __future__ import annotations

import base64
import json
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping


def parse_time(value: str | None) -> datetime | None:
    """Reads an RFC 3339 time of the API; None stays None."""
    return datetime.fromisoformat(value) if value else None


@dataclass
class Operation:
    """An asynchronous lifecycle change: a create, pause, suspend, wake,
    delete, checkpoint, fork or rollback (docs/api.md, "Operations").

    status goes pending, running, then succeeded or failed; error is
    {"code", "message"} when it failed. target_id is the sandbox it is
    about. data is the operation as the server answered it.
    """

    id: str
    kind: str
    target_id: str
    status: str
    error: dict[str, str] | None
    created_at: datetime | None
    finished_at: datetime | None
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Operation:
        return cls(id=d["id"], kind=d.get("kind", ""), target_id=d.get("target_id", ""),
                   status=d.get("status", ""), error=d.get("error"),
                   created_at=parse_time(d.get("created_at")), finished_at=parse_time(d.get("finished_at")),
                   data=dict(d))

    @property
    def done(self) -> bool:
        """Whether it has finished, succeeded or failed."""
        return self.status in ("succeeded", "failed")


@dataclass
class ExecResult:
    """What Sandbox.exec answers once the process has ended: its output as
    text (invalid UTF-8 replaced), each stream at most 16 MiB, truncated
    when more was dropped. signal names the signal that killed it ("KILL"),
    else None."""

    exit_code: int
    signal: str | None
    timed_out: bool
    stdout: str
    stderr: str
    truncated: bool

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExecResult:
        return cls(exit_code=d["exit_code"], signal=d.get("signal"), timed_out=bool(d.get("timed_out")),
                   stdout=d.get("stdout", ""), stderr=d.get("stderr", ""), truncated=bool(d.get("truncated")))


@dataclass
class Exit:
    """How a command ended: the data of its stream's exit event.

    exit_code is None when the command has none: its sandbox was rolled
    back to a checkpoint under it (rolled_back). signal names the signal
    that killed it ("KILL"), else None.
    """

    exit_code: int | None
    signal: str | None
    timed_out: bool
    duration_ms: int
    rolled_back: bool

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Exit:
        return cls(exit_code=d.get("exit_code"), signal=d.get("signal"), timed_out=bool(d.get("timed_out")),
                   duration_ms=int(d.get("duration_ms") or 0), rolled_back=bool(d.get("rolled_back")))


@dataclass
class CommandResult(Exit):
    """How a command ended, with all of its output as bytes."""

    stdout: bytes = b""
    stderr: bytes = b""


@dataclass(frozen=True)
class CommandEvent:
    """One event of a command's stream: start, stdout, stderr, gap or exit.

    id is its sequence number, what Command.events(after=...) resumes
    after. data is its JSON data: {"pid"} for start, {"data": base64} for
    stdout and stderr ("output" has the bytes), {"dropped_events"} for a
    gap, the exit's fields for exit ("exit" has them as an Exit).
    """

    id: int
    name: str
    data: dict[str, Any]

    @classmethod
    def from_sse(cls, event_id: str, name: str, data: str) -> CommandEvent:
        return cls(id=int(event_id or 0), name=name, data=json.loads(data) if data else {})

    @property
    def output(self) -> bytes:
        """The bytes of a stdout or stderr event; b"" for the others."""
        if self.name not in ("stdout", "stderr"):
            return b""
        return base64.b64decode(self.data.get("data") or "")

    @property
    def exit(self) -> Exit | None:
        """The Exit of an exit event; None for the others."""
        return Exit.from_json(self.data) if self.name == "exit" else None


@dataclass
class FileInfo:
    """A path in a sandbox: type is file, dir, symlink or other; mode is
    octal text ("0644")."""

    path: str
    type: str
    size_bytes: int
    mode: str
    modified_at: datetime | None

    @property
    def name(self) -> str:
        """The last element of the path."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FileInfo:
        return cls(path=d["path"], type=d.get("type", ""), size_bytes=int(d.get("size_bytes") or 0),
                   mode=d.get("mode", ""), modified_at=parse_time(d.get("modified_at")))


def seg(s: str) -> str:
    """Escapes one path segment of a URL."""
    return urllib.parse.quote(s, safe="")


def id_of(x: Any) -> Any:
    """The ID of an object that has one (a Sandbox, a Checkpoint), else x."""
    return getattr(x, "id", x)


def compact(d: Mapping[str, Any]) -> dict[str, Any]:
    """d without its None values."""
    return {k: v for k, v in d.items() if v is not None}
