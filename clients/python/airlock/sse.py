"""A reader of server-sent event streams (text/event-stream).

It follows the parsing rules of the HTML living standard: lines end with
CRLF, LF or CR; a line starting with ':' is a comment (the server's
": ping"); "field: value" lines set fields; a blank line ends an event; an
event without data is not dispatched, nor is one cut off by the end of the
stream. Only the fields id, event and data are used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO, Iterator

# MAX_LINE bounds one line, so that a broken stream cannot make the reader
# grow without end.
MAX_LINE = 64 << 20

_EOL = re.compile(rb"\r\n?|\n")


@dataclass(frozen=True)
class Event:
    """One server-sent event.

    id is the stream's last event ID when the event was dispatched (the
    latest id field so far, "" if none), name the event field ("message"
    when it had none), data the data fields joined by newlines.
    """

    id: str
    name: str
    data: str


class EventReader:
    """Iterates over the events of a binary stream, such as an HTTP
    response. last_id is the latest id field read so far: what a client
    sends as Last-Event-ID to resume after a reconnect."""

    def __init__(self, stream: BinaryIO, last_id: str = "") -> None:
        self._stream = stream
        self.last_id = last_id

    def __iter__(self) -> Iterator[Event]:
        name, data, has_data = "", [], False
        for raw in _lines(self._stream):
            line = raw.decode("utf-8", errors="replace")
            if line == "":
                if has_data:
                    yield Event(self.last_id, name or "message", "\n".join(data))
                name, data, has_data = "", [], False
                continue
            if line.startswith(":"):
                continue
            field, colon, value = line.partition(":")
            if colon and value.startswith(" "):
                value = value[1:]
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
                has_data = True
            elif field == "id" and "\0" not in value:
                self.last_id = value


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    """Yields the lines of stream without their ends, as they arrive: a
    line is handed on as soon as its end is read, not when a buffer fills."""
    buf = b""
    skip_lf = False  # the last line ended with a CR: a LF right after belongs to it
    while True:
        chunk = stream.read1(64 << 10)  # type: ignore[attr-defined]
        if not chunk:
            return  # a last line without its end is dropped, as the spec has it
        if skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        skip_lf = False
        buf += chunk
        start = 0
        for m in _EOL.finditer(buf):
            yield buf[start:m.start()]
            start = m.end()
            skip_lf = start == len(buf) and m.group() == b"\r"
        buf = buf[start:]
        if len(buf) > MAX_LINE:
            raise ValueError(f"event stream: a line is longer than {MAX_LINE} bytes")
