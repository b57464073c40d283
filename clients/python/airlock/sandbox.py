"""A sandbox and a checkpoint, with the calls that act on them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Sequence

from .commands import Command, command_request
from .models import CommandResult, ExecResult, FileInfo, Operation, compact, id_of, parse_time, seg
from .sse import EventReader

if TYPE_CHECKING:
    from .client import Client


class Sandbox:
    """A sandbox as the server last showed it (refresh() reads it again),
    with the calls that act on it.

    Lifecycle calls (pause, suspend, wake, delete, rollback) answer at once
    with an operation on the server; with wait (the default) they wait for
    it, raise its error if it failed, and refresh the sandbox. data is the
    sandbox as the server answered it, every field included.
    """

    def __init__(self, client: Client, data: Mapping[str, Any]) -> None:
        self.client = client
        self.operation: Operation | None = None  # the create's, for a sandbox just created
        self._set(data)

    def _set(self, d: Mapping[str, Any]) -> None:
        self.data = dict(d)
        self.id: str = d["id"]
        self.state: str = d.get("state", "")
        tpl = d.get("template") or {}
        self.template: str = tpl.get("ref", "")
        self.template_digest: str = tpl.get("digest", "")
        self.vcpus: int = d.get("vcpus", 0)
        self.memory_mib: int = d.get("memory_mib", 0)
        self.disk_mib: int = d.get("disk_mib", 0)
        self.created_at = parse_time(d.get("created_at"))
        self.expires_at = parse_time(d.get("expires_at"))
        self.metadata: dict[str, str] = d.get("metadata") or {}
        self.network: dict[str, Any] = d.get("network") or {}
        self.last_error: dict[str, str] | None = d.get("last_error")

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.state}>"

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{seg(self.id)}"

    def refresh(self) -> Sandbox:
        """Reads the sandbox again and returns it."""
        self._set(self.client.call("GET", self._path))
        return self

    def wait_for(self, *states: str, timeout: float | None = 300) -> Sandbox:
        """Reads the sandbox until its state is one of states and returns
        it; raises TimeoutError when timeout seconds (None: no end) pass
        first."""
        deadline, pause = None if timeout is None else time.monotonic() + timeout, 0.1
        while self.refresh().state not in states:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sandbox {self.id} is still {self.state} after {timeout} s, "
                                   f"not {' or '.join(states)}")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        return self

    # -- lifecycle ----------------------------------------------------------

    def _lifecycle(self, method: str, path: str, body: Any, wait: bool, timeout: float | None) -> Operation:
        ans = self.client.call(method, path, body)
        if ans.get("sandbox"):
            self._set(ans["sandbox"])
        op = Operation.from_json(ans["operation"])
        if wait:
            op = self.client.wait_operation(op, timeout=timeout)
            self.refresh()
        return op

    def pause(self, wait: bool = True, timeout: float | None = 600) -> Operation:
        """Stops the sandbox's vCPUs; its memory stays resident."""
        return self._lifecycle("POST", self._path + "/pause", None, wait, timeout)

    def suspend(self, wait: bool = True, timeout: float | None = 600) -> Operation:
        """Writes the sandbox's memory to disk and ends its VM process."""
        return self._lifecycle("POST", self._path + "/suspend", None, wait, timeout)

    def wake(self, wait: bool = True, timeout: float | None = 600) -> Operation:
        """Resumes a paused sandbox, or restores a suspended one."""
        return self._lifecycle("POST", self._path + "/wake", None, wait, timeout)

    def delete(self, wait: bool = True, timeout: float | None = 600) -> Operation:
        """Removes the sandbox: its VM, its disk and its saved state."""
        return self._lifecycle("DELETE", self._path, None, wait, timeout)

    def keep(self, timeout_s: int) -> Sandbox:
        """Sets the lease to end timeout_s seconds from now; 0 removes it,
        so that the sandbox lives until it is deleted."""
        self._set(self.client.call("POST", self._path + "/keep", {"timeout_s": timeout_s}))
        return self

    def set_network(self, policy: Mapping[str, Any]) -> Sandbox:
        """Replaces the sandbox's egress policy (docs/network.md); open
        connections the new policy forbids are closed."""
        self._set(self.client.call("PUT", self._path + "/network", dict(policy)))
        return self

    def metrics(self) -> dict[str, Any]:
        """Measures the running sandbox now: CPU, memory and disk."""
        return self.client.call("GET", self._path + "/metrics")

    def watch(self) -> Iterator[Sandbox]:
        """Yields the sandbox anew at each change of its state, from now on,
        until the caller stops or the server ends the stream."""
        with self.client.request("GET", self._path + "/events", headers={"Accept": "text/event-stream"}) as resp:
            for ev in EventReader(resp):
                if ev.name == "state":
                    self._set(json.loads(ev.data))
                    yield self

    # -- commands -----------------------------------------------------------

    def exec(self, command: str | Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             user: str | None = None, timeout_s: int | None = None) -> ExecResult:
        """Runs a command to its end and returns its exit status and output
        as text, in one request. A string runs under /bin/sh -c, a list as
        the program and its arguments. For input, bytes, output past 16 MiB
        or output as it comes, use run or start."""
        req = command_request(command, env=env, cwd=cwd, user=user, timeout_s=timeout_s)
        return ExecResult.from_json(self.client.call("POST", self._path + "/exec", req))

    def start(self, command: str | Sequence[str], *, stdin: bool = False, pty: tuple[int, int] | None = None,
              env: Mapping[str, str] | None = None, cwd: str | None = None, user: str | None = None,
              timeout_s: int | None = None) -> Command:
        """Creates a command session. Its process starts when it is first
        attached to (Command.events, stream or wait), so no output is lost.
        stdin: the process reads what Command.write_stdin sends; pty: run it
        on a terminal of (rows, cols)."""
        req = command_request(command, env=env, cwd=cwd, user=user, timeout_s=timeout_s, stdin=stdin, pty=pty)
        return Command(self.client, self.client.call("POST", self._path + "/commands", req))

    def run(self, command: str | Sequence[str], *, stdin: bytes | None = None,
            on_stdout: Callable[[bytes], Any] | None = None, on_stderr: Callable[[bytes], Any] | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None, user: str | None = None,
            timeout_s: int | None = None) -> CommandResult:
        """Runs a command to its end through a session and returns its exit
        and all of its output as bytes. on_stdout and on_stderr get each
        chunk as it comes; stdin, if given, is sent once the process has
        started, then closed. A dropped stream is attached again where it
        stopped."""
        cmd = self.start(command, stdin=stdin is not None, env=env, cwd=cwd, user=user, timeout_s=timeout_s)
        return cmd.wait(stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr)

    def commands(self) -> list[dict[str, Any]]:
        """Returns the states of the sandbox's commands (see Client.get_command)."""
        return list(self.client.list_all(self._path + "/commands"))

    # -- files --------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str | BinaryIO | Iterable[bytes], mode: int | None = None) -> None:
        """Writes a file, replacing it and making its missing parent
        directories. data is bytes, text (written as UTF-8), or a binary
        file or an iterable of bytes, sent as it is read. mode is the
        permission bits (0o755); the server's default is 0o644."""
        if isinstance(data, str):
            data = data.encode()
        q = compact({"path": path, "mode": None if mode is None else f"{mode:04o}"})
        with self.client.request("PUT", self._path + "/files", query=q, data=data):
            pass

    def read_file(self, path: str) -> bytes:
        """Returns the bytes of a file."""
        with self.client.request("GET", self._path + "/files", query={"path": path}) as resp:
            return resp.read()

    def stat(self, path: str) -> FileInfo:
        """Describes a path."""
        return FileInfo.from_json(self.client.call("GET", self._path + "/fs/stat", query={"path": path}))

    def list_dir(self, path: str, depth: int = 1) -> list[FileInfo]:
        """Describes what is in a directory, depth levels down (1 to 16)."""
        ans = self.client.call("GET", self._path + "/fs/list", query={"path": path, "depth": depth})
        return [FileInfo.from_json(d) for d in ans.get("items") or []]

    def mkdir(self, path: str) -> None:
        """Makes a directory and its missing parents."""
        self.client.call("POST", self._path + "/fs/mkdir", {"path": path})

    def move(self, src: str, dst: str) -> None:
        """Moves or renames a path."""
        self.client.call("POST", self._path + "/fs/move", {"from": src, "to": dst})

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, or a directory (one with content needs recursive)."""
        q = {"path": path, "recursive": "true" if recursive else None}
        self.client.call("DELETE", self._path + "/files", query=q)

    def upload_archive(self, path: str, tar: bytes | BinaryIO) -> None:
        """Extracts a tar stream into a directory, made if missing."""
        with self.client.request("PUT", self._path + "/archive", query={"path": path}, data=tar):
            pass

    def download_archive(self, path: str) -> bytes:
        """Returns a directory's contents as a tar stream's bytes."""
        with self.client.request("GET", self._path + "/archive", query={"path": path}) as resp:
            return resp.read()

    # -- checkpoints --------------------------------------------------------

    def checkpoint(self, name: str | None = None, wait: bool = True, timeout: float | None = 600) -> Checkpoint:
        """Takes a checkpoint of the sandbox, which runs on: its memory,
        processes and disk at this instant. With wait, returns it ready."""
        ans = self.client.call("POST", self._path + "/checkpoints", compact({"name": name}))
        chk = Checkpoint(self.client, ans["checkpoint"])
        chk.operation = Operation.from_json(ans["operation"])
        if wait:
            self.client.wait_operation(chk.operation, timeout=timeout)
            chk.refresh()
        return chk

    def checkpoints(self) -> list[Checkpoint]:
        """Returns the sandbox's checkpoints, oldest first."""
        return self.client.list_checkpoints(sandbox_id=self.id)

    def fork(self, count: int = 1, *, timeout_s: int | None = None, metadata: Mapping[str, str] | None = None,
             wait: bool = True, timeout: float | None = 600) -> Fork:
        """Takes a checkpoint and starts count sandboxes (1 to 100) from it;
        the sandbox runs on. With wait, waits until each new sandbox runs or
        has failed (its last_error says why). The checkpoint outlives them:
        delete it when it is no longer needed."""
        ans = self.client.call("POST", self._path + "/fork",
                               compact({"count": count, "timeout_s": timeout_s, "metadata": metadata}))
        op = Operation.from_json(ans["operation"])
        fork = Fork(sandboxes=[Sandbox(self.client, d) for d in ans.get("sandboxes") or []],
                    checkpoint=Checkpoint(self.client, {"id": ans["checkpoint"], "sandbox_id": self.id}),
                    operation=op)
        if wait:
            started = time.monotonic()
            self.client.wait_operation(op, timeout=timeout)
            fork.checkpoint.refresh()
            for child in fork.sandboxes:
                left = None if timeout is None else max(1.0, timeout - (time.monotonic() - started))
                child.wait_for("running", "failed", timeout=left)
        return fork

    def rollback(self, checkpoint: str | Checkpoint, wait: bool = True, timeout: float | None = 600) -> Operation:
        """Returns the sandbox's memory, processes and disk to one of its
        own checkpoints, under the same ID. Its open commands end with
        rolled_back."""
        return self._lifecycle("POST", self._path + "/rollback", {"checkpoint": id_of(checkpoint)}, wait, timeout)


@dataclass
class Fork:
    """What Sandbox.fork made: the new sandboxes, the checkpoint they start
    from, and the fork's operation, which ends when the checkpoint is
    ready."""

    sandboxes: list[Sandbox]
    checkpoint: Checkpoint
    operation: Operation


class Checkpoint:
    """A sandbox's memory, devices and disk at one instant, kept apart from
    the sandbox. state is creating, ready or failed. A new sandbox starts
    from it with Client.create_sandbox(checkpoint=...)."""

    def __init__(self, client: Client, data: Mapping[str, Any]) -> None:
        self.client = client
        self.operation: Operation | None = None  # the checkpoint's, for one just taken
        self._set(data)

    def _set(self, d: Mapping[str, Any]) -> None:
        self.data = dict(d)
        self.id: str = d["id"]
        self.sandbox_id: str = d.get("sandbox_id", "")
        self.name: str = d.get("name", "")
        self.state: str = d.get("state", "")
        self.template: str = (d.get("template") or {}).get("ref", "")
        self.size_bytes: int = d.get("size_bytes") or 0
        self.created_at = parse_time(d.get("created_at"))
        self.last_error: dict[str, str] | None = d.get("last_error")

    def __repr__(self) -> str:
        return f"<Checkpoint {self.id} of {self.sandbox_id} {self.state}>"

    def refresh(self) -> Checkpoint:
        """Reads the checkpoint again and returns it."""
        self._set(self.client.call("GET", f"/v1/checkpoints/{seg(self.id)}"))
        return self

    def delete(self) -> None:
        """Deletes the checkpoint; its storage goes once no sandbox needs it."""
        self.client.delete_checkpoint(self.id)
