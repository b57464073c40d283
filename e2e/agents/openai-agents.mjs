// The OpenAI Agents SDK's E2B sandbox client (@openai/agents-extensions
// /sandbox/e2b over npm e2b, pinned in package-lock.json) against
// airlock's E2B-compatible API, unchanged and without any model call:
// each case calls what an agent's sandbox tools would call on the
// session (commands, files, a PTY, ports, workspace persistence, pause
// and resume across a serialized session state). Run by
// e2e/agents_sdk_test.go with the environment e2e/e2bsdk/sdk.mjs gets:
//
//	E2B_API_URL, E2B_SANDBOX_URL  http://ADDR (control plane and envd on one listener)
//	E2B_API_KEY                   an e2b_ key
//	E2B_DOMAIN                    e2b.test
//	E2E_RUN_ID                    a value unique to this run, put in metadata
//
// It prints one JSON line per case, as harness.mjs does for the E2B SDK
// scripts.

import { Manifest, file, dir } from '@openai/agents/sandbox'
import { E2BSandboxClient } from '@openai/agents-extensions/sandbox/e2b'
import { Sandbox } from 'e2b'
import { assert, equal, rejects, run } from '../e2bsdk/harness.mjs'

const env = process.env
for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_DOMAIN']) {
  if (!env[k]) {
    console.error(`${k} is not set`)
    process.exit(2)
  }
}
const runId = env.E2E_RUN_ID || String(Date.now())
const metadata = { suite: 'airlock-e2e-agents', run: runId }

// Options as an application would give the client: creates and resumes
// are slow under TCG, hence the long request timeout.
const base = {
  template: 'base',
  timeout: 900,
  requestTimeoutMs: 180_000,
  commandTimeoutMs: 60_000,
  metadata,
  exposedPorts: [8080],
}

const made = new Set() // sandbox IDs the cases made, killed at the end
let client // the tar-persisting client
let session // its session

// exitOf reads the exit code out of execCommand's text answer.
function exitOf(out) {
  const m = /Process exited with code (-?\d+)/.exec(out)
  return m ? Number(m[1]) : undefined
}

// outputOf is execCommand's output, after its "Output:" line.
function outputOf(out) {
  const i = out.indexOf('\nOutput:\n')
  return i < 0 ? out : out.slice(i + '\nOutput:\n'.length)
}

async function exec(s, cmd, opts = {}) {
  const out = await s.execCommand({ cmd, ...opts })
  return { code: exitOf(out), out: outputOf(out), raw: out }
}

const text = (b) => (typeof b === 'string' ? b : new TextDecoder().decode(b))

const manifest = () =>
  new Manifest({
    root: '/workspace',
    entries: {
      'notes/hello.txt': file({ content: 'hello from the manifest\n' }),
      'empty-dir': dir(),
    },
    environment: { GREETING: 'hi-from-env' },
  })

const cases = [
  {
    name: 'create a session from a manifest',
    timeoutMs: 300_000,
    fn: async (log) => {
      client = new E2BSandboxClient({ ...base, workspacePersistence: 'tar', pauseOnExit: true })
      session = await client.create({ manifest: manifest() })
      const id = session.state.sandboxId
      made.add(id)
      log('sandbox', id)
      assert(/^[a-z0-9]+$/i.test(id), 'a sandbox ID', id)
      equal(session.state.pauseOnExitSupported, true, 'pause is supported')
      const info = await Sandbox.getInfo(id)
      equal(info.state, 'running', 'the sandbox runs')
      equal(info.metadata.run, runId, 'metadata reached the sandbox')
      equal(text(await session.readFile({ path: 'notes/hello.txt' })), 'hello from the manifest\n', 'the manifest file')
      equal(await session.directoryExists('empty-dir'), true, 'the manifest directory')
      equal(await session.pathExists('notes/nothing.txt'), false, 'a path that is not there')
    },
  },
  {
    name: 'execCommand: output, exit codes, workdir, environment',
    needs: ['create a session from a manifest'],
    fn: async (log) => {
      const ok = await exec(session, 'echo "$GREETING"; pwd; echo to-stderr >&2')
      log(ok.raw)
      equal(ok.code, 0, 'exit code')
      assert(ok.out.includes('hi-from-env\n') && ok.out.includes('/workspace\n'), 'stdout has the environment and the workspace root', ok.out)
      assert(ok.out.includes('to-stderr'), 'stderr is part of the output', ok.out)
      const bad = await exec(session, 'echo partial; exit 7')
      equal(bad.code, 7, 'a failing command is a result with its code')
      assert(bad.out.includes('partial'), 'and its output', bad.out)
      const sub = await exec(session, 'pwd', { workdir: 'notes' })
      equal(sub.out.trim(), '/workspace/notes', 'workdir relative to the root')
      const big = await exec(session, 'head -c 300000 /dev/zero | tr "\\0" x; echo')
      equal(big.code, 0, 'a large output')
      assert(big.out.length >= 1000, 'large output arrives (maybe truncated by the SDK)', big.out.length)
    },
  },
  {
    name: 'files: materialize, read, editor, binary',
    needs: ['create a session from a manifest'],
    fn: async () => {
      await session.materializeEntry({ path: 'src/app.py', entry: file({ content: 'print("from the agent")\n' }) })
      equal(text(await session.readFile({ path: 'src/app.py' })), 'print("from the agent")\n', 'a materialized file')
      const py = await exec(session, 'python3 src/app.py')
      equal(py.out.trim(), 'from the agent', 'the file runs')
      const bin = new Uint8Array(256).map((_, i) => i)
      await session.materializeEntry({ path: 'data/bytes.bin', entry: file({ content: bin }) })
      const back = await session.readFile({ path: 'data/bytes.bin' })
      equal(Buffer.compare(Buffer.from(back), Buffer.from(bin)), 0, 'binary content read back')
      const head = await session.readFile({ path: 'data/bytes.bin', maxBytes: 4 })
      equal(Array.from(head).join(','), '0,1,2,3', 'maxBytes')
      const sum = await exec(session, 'sha256sum data/bytes.bin | cut -c1-16')
      equal(sum.out.trim(), '40aff2e9d2d8922e', 'the guest sees the same bytes')
      const err = await rejects(() => session.readFile({ path: 'no/such/file' }), 'reading a missing file')
      assert(String(err).length > 0, 'an error for a missing file', err)
      const ed = session.createEditor()
      assert(ed && typeof ed === 'object', 'an editor', ed)
    },
  },
  {
    name: 'tty: a PTY command fed through writeStdin',
    needs: ['create a session from a manifest'],
    timeoutMs: 120_000,
    fn: async (log) => {
      equal(session.supportsPty(), true, 'the client offers a PTY')
      const first = await session.execCommand({ cmd: 'read -r line; echo "got:$line"', tty: true, yieldTimeMs: 2000 })
      log(first)
      const sid = /session ID (\d+)/.exec(first)
      assert(sid, 'a running PTY session', first)
      let out = await session.writeStdin({ sessionId: Number(sid[1]), chars: 'typed-in\n', yieldTimeMs: 3000 })
      log(out)
      for (let i = 0; i < 10 && !/got:typed-in/.test(out); i++) {
        out += await session.writeStdin({ sessionId: Number(sid[1]), chars: '', yieldTimeMs: 2000 }).catch((e) => String(e))
      }
      assert(/got:typed-in/.test(out), 'the PTY saw the input', out)
    },
  },
  {
    name: 'resolveExposedPort',
    needs: ['create a session from a manifest'],
    fn: async (log) => {
      const ep = await session.resolveExposedPort(8080)
      log(ep)
      assert(ep.host.startsWith(`8080-${session.state.sandboxId}.`) && ep.host.endsWith(env.E2B_DOMAIN), 'the port host under the sandbox domain', ep)
      await rejects(() => session.resolveExposedPort(9999), 'a port not configured')
    },
  },
  {
    name: 'persistWorkspace and hydrateWorkspace (tar)',
    needs: ['create a session from a manifest'],
    timeoutMs: 120_000,
    fn: async (log) => {
      await exec(session, 'echo kept > kept.txt && mkdir -p deep/er && echo nested > deep/er/n.txt')
      const archive = await session.persistWorkspace()
      log('archive bytes', archive.byteLength)
      assert(archive.byteLength > 1024, 'a tar of the workspace', archive.byteLength)
      await exec(session, 'rm -rf kept.txt deep && echo junk > junk.txt')
      await session.hydrateWorkspace(archive)
      const after = await exec(session, 'cat kept.txt deep/er/n.txt notes/hello.txt; ls')
      log(after.out)
      assert(after.out.startsWith('kept\nnested\nhello from the manifest\n'), 'the workspace is back', after.out)
      assert(!after.out.includes('junk.txt'), 'what came after the archive is gone', after.out)
    },
  },
  {
    name: 'pause on cleanup, serialize, resume: the sandbox and its memory come back',
    needs: ['create a session from a manifest'],
    timeoutMs: 420_000,
    fn: async (log) => {
      const id = session.state.sandboxId
      // /dev/shm is memory: it survives only if the VM's memory does.
      await exec(session, 'echo in-memory > /dev/shm/marker && echo on-disk > disk.txt')
      equal(client.canPersistOwnedSessionState(session.state), true, 'the state may be persisted')
      const saved = JSON.parse(JSON.stringify(await client.serializeSessionState(session.state)))
      await session.delete({ reason: 'cleanup', preserveOwnedSessions: true })
      equal((await Sandbox.getInfo(id)).state, 'paused', 'cleanup paused the sandbox')
      // A new client in a new "process" resumes from the saved state.
      const other = new E2BSandboxClient({ ...base, workspacePersistence: 'tar', pauseOnExit: true })
      const state = await other.deserializeSessionState(saved)
      const resumed = await other.resume(state)
      equal(resumed.state.sandboxId, id, 'resume connects to the same sandbox')
      equal((await Sandbox.getInfo(id)).state, 'running', 'the sandbox runs again')
      const back = await exec(resumed, 'cat /dev/shm/marker disk.txt; echo "$GREETING"')
      log(back.out)
      equal(back.out, 'in-memory\non-disk\nhi-from-env\n', 'memory, disk and environment survived')
      session = resumed
      client = other
    },
  },
  {
    name: 'persistWorkspace and hydrateWorkspace (native snapshot)',
    needs: ['create a session from a manifest'],
    timeoutMs: 600_000,
    fn: async (log) => {
      const snapClient = new E2BSandboxClient({ ...base, workspacePersistence: 'snapshot' })
      const s = await snapClient.create({ manifest: manifest() })
      const first = s.state.sandboxId
      made.add(first)
      await exec(s, 'echo before-snapshot > snap.txt')
      const ref = await s.persistWorkspace()
      log('snapshot ref', text(ref))
      assert(/^E2B_SANDBOX_SNAPSHOT_V1\n.*"snapshot_id":"chk[a-z0-9]+"/s.test(text(ref)), 'a reference to an airlock checkpoint', text(ref))
      await exec(s, 'echo after-snapshot > snap.txt && echo junk > junk.txt')
      await s.hydrateWorkspace(ref)
      const second = s.state.sandboxId
      made.add(second)
      assert(second !== first, 'hydrating made a sandbox from the snapshot', { first, second })
      const gone = await Sandbox.getInfo(first).then(
        () => false,
        () => true,
      )
      equal(gone, true, 'the sandbox before the snapshot was killed')
      const out = await exec(s, 'cat snap.txt notes/hello.txt; ls')
      log(out.out)
      assert(out.out.startsWith('before-snapshot\nhello from the manifest\n'), 'the workspace as it was at the snapshot', out.out)
      assert(!out.out.includes('junk.txt'), 'nothing of after the snapshot', out.out)
      await s.close()
      equal(
        await Sandbox.getInfo(second).then(
          () => 'there',
          () => 'gone',
        ),
        'gone',
        'close killed it',
      )
    },
  },
  {
    name: 'close, then resume of a killed sandbox makes a new one from the manifest',
    needs: ['create a session from a manifest'],
    timeoutMs: 300_000,
    fn: async (log) => {
      const id = session.state.sandboxId
      const saved = JSON.parse(JSON.stringify(await client.serializeSessionState(session.state)))
      // pauseOnExit: close pauses rather than kills.
      await session.close()
      equal((await Sandbox.getInfo(id)).state, 'paused', 'close with pauseOnExit pauses')
      equal(await Sandbox.kill(id), true, 'kill it')
      // The sandbox is gone: resume falls back to a new sandbox made
      // from the saved manifest and environment.
      const again = await client.resume(await client.deserializeSessionState(saved))
      const fresh = again.state.sandboxId
      made.add(fresh)
      log('recreated as', fresh)
      assert(fresh !== id, 'a new sandbox', { id, fresh })
      const out = await exec(again, 'cat notes/hello.txt; echo "$GREETING"; test -e disk.txt && echo stale || echo fresh')
      equal(out.out, 'hello from the manifest\nhi-from-env\nfresh\n', 'the manifest applied anew, nothing of the old disk')
      await again.delete()
      equal(
        await Sandbox.getInfo(fresh).then(
          () => 'there',
          () => 'gone',
        ),
        'gone',
        'delete killed it',
      )
    },
  },
]

const failed = await run(cases, () => ({ sandboxes: [...made] }))
for (const id of made) await Sandbox.kill(id).catch(() => {})
process.exit(failed ? 1 : 0)
