"""A client of airlock's HTTP API, version 1, on Python's standard library.

    from airlock import Client

    client = Client()                      # AIRLOCK_URL, AIRLOCK_API_KEY
    sbx = client.create_sandbox("base")    # waits until it runs
    print(sbx.exec("echo hello from $(hostname)").stdout)
    sbx.delete()

Client makes sandboxes and reads operations, checkpoints and commands;
Sandbox runs commands (exec, run, start), moves files, changes its
lifecycle (pause, suspend, wake, keep, delete) and takes checkpoints, forks
and rollbacks; Command follows a session's output stream with replay.
Every failed call raises an AirlockError subclass named for the API's
error code. docs/api.md is the API's guide.
"""

from .client import DEFAULT_URL, Client
from .commands import Command
from .errors import (AirlockError, Conflict, InternalError, InvalidArgument, NotFound, PayloadTooLarge,
                     PermissionDenied, ProtocolError, ResourceExhausted, Unauthenticated, Unavailable)
from .models import CommandEvent, CommandResult, ExecResult, Exit, FileInfo, Operation
from .sandbox import Checkpoint, Fork, Sandbox
from .sse import Event, EventReader

__all__ = [
    "DEFAULT_URL", "Client", "Sandbox", "Checkpoint", "Fork", "Command", "Operation",
    "ExecResult", "Exit", "CommandResult", "CommandEvent", "FileInfo", "Event", "EventReader",
    "AirlockError", "InvalidArgument", "Unauthenticated", "PermissionDenied", "NotFound", "Conflict",
    "PayloadTooLarge", "ResourceExhausted", "InternalError", "Unavailable", "ProtocolError",
]
