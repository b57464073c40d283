"""The client against a real airlock server with real VMs.

    AIRLOCK_URL, AIRLOCK_API_KEY   the server and an admin key (required)
    AIRLOCK_TEMPLATE               the template to start from (default tiny)
    AIRLOCK_TEST_LABEL             the value of the metadata label "test" on
                                   every sandbox made (default pyclient)

The tests share one sandbox and run in the order of their names; the last
deletes it. e2e/pyclient_test.go runs them against the e2e server.
"""

from __future__ import annotations

import io
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import airlock  # noqa: E402
from airlock import (Client, Conflict, InvalidArgument, NotFound, Sandbox,  # noqa: E402
                     Unauthenticated)

TEMPLATE = os.environ.get("AIRLOCK_TEMPLATE", "tiny")
LABEL = {"test": os.environ.get("AIRLOCK_TEST_LABEL", "pyclient")}


@unittest.skipUnless(os.environ.get("AIRLOCK_URL") and os.environ.get("AIRLOCK_API_KEY"),
                     "needs a server: set AIRLOCK_URL and AIRLOCK_API_KEY")
class LiveTest(unittest.TestCase):
    client: Client
    sbx: Sandbox
    others: list[Sandbox]  # made from checkpoints and forks, deleted at the end

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Client()
        cls.others = []
        cls.sbx = cls.client.create_sandbox(TEMPLATE, env={"GREETING": "hello"}, metadata=LABEL, timeout_s=900)

    @classmethod
    def tearDownClass(cls) -> None:
        for s in [cls.sbx, *cls.others]:
            try:
                s.delete()
            except Conflict:
                pass  # deleted already

    def test_01_sandbox(self) -> None:
        s = self.sbx
        self.assertEqual(s.state, "running")
        self.assertEqual(s.template, TEMPLATE + ":latest")
        self.assertTrue(s.template_digest.startswith("sha256:"))
        self.assertEqual(s.metadata, LABEL)
        self.assertIsNotNone(s.operation)
        self.assertEqual((s.operation.kind, s.operation.target_id), ("create", s.id))
        self.assertEqual(self.client.get_sandbox(s.id).state, "running")
        self.assertEqual([x.id for x in self.client.list_sandboxes(metadata=LABEL)], [s.id])
        self.assertEqual(self.client.list_sandboxes(state="paused", metadata=LABEL), [])
        self.assertIsNotNone(s.keep(600).expires_at)
        self.assertIsNone(s.keep(0).expires_at)

    def test_02_exec(self) -> None:
        r = self.sbx.exec("echo $GREETING from $(hostname); echo oops >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.truncated),
                         (3, f"hello from {self.sbx.id}\n", "oops\n", False))
        r = self.sbx.exec(["sh", "-c", 'echo "$0 $X"; pwd', "argv"], env={"X": "y"}, cwd="/tmp")
        self.assertEqual((r.exit_code, r.stdout), (0, "argv y\n/tmp\n"))
        r = self.sbx.exec("sleep 30", timeout_s=1)
        self.assertEqual((r.timed_out, r.signal), (True, "KILL"))

    def test_03_run_streams(self) -> None:
        chunks: list[tuple[str, bytes]] = []
        r = self.sbx.run("for i in 1 2 3; do echo out $i; echo err $i >&2; done; printf '\\377\\000'; exit 4",
                         on_stdout=lambda b: chunks.append(("out", b)),
                         on_stderr=lambda b: chunks.append(("err", b)))
        self.assertEqual(r.exit_code, 4)
        self.assertEqual(r.stdout, b"out 1\nout 2\nout 3\n\xff\x00")
        self.assertEqual(r.stderr, b"err 1\nerr 2\nerr 3\n")
        self.assertEqual(b"".join(b for k, b in chunks if k == "out"), r.stdout)
        self.assertFalse(r.rolled_back)
        r = self.sbx.run(["wc", "-c"], stdin=b"x" * 100000)
        self.assertEqual((r.exit_code, r.stdout.strip()), (0, b"100000"))

    def test_04_replay(self) -> None:
        cmd = self.sbx.start("for i in 1 2 3 4 5 6; do echo line $i; sleep 0.2; done; echo done >&2")
        # Read the first three lines, then drop the connection.
        seen, last = b"", 0
        for ev in cmd.events():
            last = ev.id
            seen += ev.output if ev.name == "stdout" else b""
            if seen.count(b"\n") == 3:
                break
        self.assertEqual(seen, b"line 1\nline 2\nline 3\n")
        # Resume after the last event: the rest, once each.
        rest = cmd.wait(after=last)
        self.assertEqual(rest.exit_code, 0)
        self.assertEqual(seen + rest.stdout, b"".join(b"line %d\n" % i for i in range(1, 7)))
        self.assertEqual(rest.stderr, b"done\n")
        # Once it has ended, an attach replays it all, from the start or
        # from any event on.
        events = list(cmd.events())
        self.assertEqual([e.name for e in events][0], "start")
        self.assertEqual(events[-1].exit, airlock.Exit(0, None, False, events[-1].exit.duration_ms, False))
        self.assertEqual([e.id for e in events], list(range(1, len(events) + 1)))
        tail = list(cmd.events(after=events[2].id))
        self.assertEqual(tail, events[3:])
        self.assertEqual(cmd.wait().stdout, seen + rest.stdout)
        self.assertEqual(cmd.info()["state"], "exited")
        self.assertIn(cmd.id, [c["id"] for c in self.sbx.commands()])
        # The attach token opens the stream in place of the key.
        tok = list(cmd.events(token=cmd.attach_token))
        self.assertEqual(tok[-1].name, "exit")

    def test_05_stdin_signals(self) -> None:
        cmd = self.sbx.start(["cat"], stdin=True)
        events = cmd.events()
        self.assertEqual(next(events).name, "start")
        cmd.write_stdin(b"first\n")
        self.assertEqual(next(events).output, b"first\n")
        cmd.write_stdin(b"second\n", eof=True)
        self.assertEqual(b"".join(e.output for e in events), b"second\n")
        self.assertEqual(cmd.info()["exit_code"], 0)

        cmd = self.sbx.start("echo up; sleep 600")
        events = cmd.events()
        self.assertEqual([next(events).name, next(events).output], ["start", b"up\n"])
        cmd.kill()
        ex = [e for e in events][-1].exit
        self.assertEqual(ex.signal, "KILL", ex)
        with self.assertRaises(Conflict):
            cmd.signal("TERM")

    def test_06_files(self) -> None:
        s, d = self.sbx, "/tmp/py client"
        data = bytes(range(256)) * 64
        s.write_file(d + "/data.bin", data)
        s.write_file(d + "/hi.sh", "echo hi \u00e9\n", mode=0o755)
        self.assertEqual(s.read_file(d + "/data.bin"), data)
        s.write_file(d + "/streamed", io.BytesIO(data))  # sent chunked, as it is read
        s.write_file(d + "/parts", (data[i:i + 1000] for i in range(0, len(data), 1000)))
        self.assertEqual([s.read_file(d + "/streamed"), s.read_file(d + "/parts")], [data, data])
        s.remove(d + "/streamed")
        s.remove(d + "/parts")
        st = s.stat(d + "/hi.sh")
        self.assertEqual((st.type, st.mode, st.size_bytes, st.name), ("file", "0755", len("echo hi \u00e9\n".encode()), "hi.sh"))
        self.assertEqual(s.exec(["sh", d + "/hi.sh"]).stdout, "echo hi \u00e9\n"[5:])
        s.mkdir(d + "/sub/deeper")
        s.move(d + "/hi.sh", d + "/sub/hi.sh")
        self.assertEqual(sorted((f.name, f.type) for f in s.list_dir(d)), [("data.bin", "file"), ("sub", "dir")])
        self.assertIn(d + "/sub/hi.sh", [f.path for f in s.list_dir(d, depth=3)])
        tar = s.download_archive(d + "/sub")
        s.upload_archive("/tmp/copy", tar)
        self.assertEqual(s.read_file("/tmp/copy/hi.sh"), "echo hi \u00e9\n".encode())
        with self.assertRaises(InvalidArgument):
            s.remove(d)  # not empty
        s.remove(d, recursive=True)
        with self.assertRaises(NotFound):
            s.read_file(d + "/data.bin")
        with self.assertRaises(InvalidArgument):
            s.read_file("/tmp")  # a directory

    def test_07_errors(self) -> None:
        with self.assertRaises(NotFound) as e:
            self.client.get_sandbox("sbx" + "0" * 20)
        self.assertEqual((e.exception.status, e.exception.code), (404, "not_found"))
        self.assertTrue(e.exception.message)
        with self.assertRaises(NotFound):
            self.client.get_checkpoint("chk" + "0" * 20)
        with self.assertRaises(InvalidArgument) as e:
            self.client.create_sandbox(TEMPLATE, vcpus=100000, metadata=LABEL)
        self.assertEqual((e.exception.status, e.exception.code), (400, "invalid_argument"))
        self.assertIn("vcpus", e.exception.message)
        with self.assertRaises(InvalidArgument):
            self.sbx.read_file("relative/path")
        with self.assertRaises(NotFound) as e:
            self.client.create_sandbox("no-such-template", metadata=LABEL)
        self.assertIn("tiny", e.exception.message)  # it names the templates there are
        with self.assertRaises(Unauthenticated) as e:
            Client(api_key="alk_not_a_key").list_sandboxes()
        self.assertEqual((e.exception.status, e.exception.code), (401, "unauthenticated"))
        self.assertIsInstance(e.exception, airlock.AirlockError)
        self.assertEqual([s.id for s in self.client.list_sandboxes(metadata=LABEL)], [self.sbx.id])

    def test_08_lifecycle(self) -> None:
        s = self.sbx
        s.write_file("/root/kept", "across the lifecycle")
        s.pause()
        self.assertEqual(s.state, "paused")
        with self.assertRaises(Conflict) as e:
            s.pause()
        self.assertIn("paused", e.exception.message)
        with self.assertRaises(Conflict):
            s.exec("true")
        op = s.wake()
        self.assertEqual((op.kind, op.status, s.state), ("wake", "succeeded", "running"))
        op = s.suspend(wait=False)
        self.assertEqual(op.kind, "suspend")
        self.client.wait_operation(op.id)
        self.assertEqual(s.refresh().state, "suspended")
        s.wake()
        self.assertEqual(s.state, "running")
        self.assertEqual(s.read_file("/root/kept"), b"across the lifecycle")

    def test_09_checkpoints(self) -> None:
        s = self.sbx
        s.write_file("/root/state", "at the checkpoint")
        chk = s.checkpoint(name="py")
        self.assertEqual((chk.state, chk.sandbox_id, chk.name), ("ready", s.id, "py"))
        self.assertGreater(chk.size_bytes, 0)
        self.assertIn(chk.id, [c.id for c in s.checkpoints()])
        self.assertEqual(self.client.get_checkpoint(chk.id).state, "ready")
        s.write_file("/root/state", "after the checkpoint")

        # A sandbox from the checkpoint has its disk, under its own ID.
        child = self.client.create_sandbox(checkpoint=chk, metadata=LABEL)
        self.others.append(child)
        self.assertEqual((child.state, child.template), ("running", s.template))
        self.assertEqual(child.exec("cat /root/state; echo; hostname").stdout, f"at the checkpoint\n{child.id}\n")

        # A fork has the source's disk of now.
        fork = s.fork(1, metadata=LABEL)
        self.others.extend(fork.sandboxes)
        self.assertEqual([f.state for f in fork.sandboxes], ["running"])
        self.assertEqual((fork.operation.kind, fork.checkpoint.state, fork.checkpoint.sandbox_id), ("fork", "ready", s.id))
        self.assertEqual(fork.sandboxes[0].exec("cat /root/state").stdout, "after the checkpoint")

        # Rolled back, the source has its disk of the checkpoint again, and
        # a command it ran meanwhile ends rolled back.
        cmd = s.start("sleep 600")
        events = cmd.events()
        start = next(events)
        self.assertEqual(start.name, "start")
        op = s.rollback(chk)
        self.assertEqual((op.kind, s.state), ("rollback", "running"))
        rest = list(events)
        self.assertIn(b"rolled back", b"".join(e.output for e in rest if e.name == "stderr"))
        self.assertEqual((rest[-1].exit.rolled_back, rest[-1].exit.exit_code), (True, None))
        replayed = cmd.wait(after=start.id)
        self.assertEqual((replayed.rolled_back, replayed.exit_code), (True, None))
        self.assertEqual(s.read_file("/root/state"), b"at the checkpoint")
        with self.assertRaises(InvalidArgument):
            child.rollback(chk)  # another sandbox's checkpoint

        for c in (chk, fork.checkpoint):
            c.delete()
            with self.assertRaises(NotFound):
                c.refresh()
        self.assertEqual(s.checkpoints(), [])

    def test_10_delete(self) -> None:
        for s in self.others:
            s.delete()
            self.assertEqual(s.state, "deleted")
        op = self.sbx.delete()
        self.assertEqual((op.kind, self.sbx.state), ("delete", "deleted"))
        self.assertEqual(self.client.get_sandbox(self.sbx.id).state, "deleted")
        with self.assertRaises(Conflict):
            self.sbx.delete()
        self.assertEqual(self.client.list_sandboxes(metadata=LABEL), [])
        self.assertIn(self.sbx.id, [x.id for x in self.client.list_sandboxes(state="deleted", metadata=LABEL)])


if __name__ == "__main__":
    unittest.main()
