// E2B's JavaScript SDK (npm e2b, pinned in package.json) against airlock's
// E2B-compatible API. Run by e2e/e2b_sdk_test.go, which starts
// `airlock serve --e2b-listen ADDR --e2b-domain e2b.test` and sets:
//
//	E2B_API_URL, E2B_SANDBOX_URL  http://ADDR (control plane and envd on one listener)
//	E2B_API_KEY                   an e2b_ key minted with POST /v1/keys {"format": "e2b"}
//	E2B_DOMAIN                    e2b.test (what getHost() builds names under)
//	E2E_RUN_ID                    a value unique to this run, put in metadata
//	E2E_EGRESS_ALLOWED, E2E_EGRESS_DENIED, E2E_EGRESS_IP
//	                              names the test host's DNS answers and its
//	                              address; unset when there is no test host
//
// The control plane is reached through a recording proxy (harness.mjs) so
// that cases can check the routes the SDK called and what they answered.
// One sandbox of the base template (bash, python3) serves most cases; a
// second one, made with allowInternetAccess: false, serves the egress case.

import { Sandbox, CommandExitError, FileType, NotFoundError, SandboxNotFoundError } from 'e2b'
import { readFileSync } from 'node:fs'
import { Skip, assert, equal, httpGet, recorder, rejects, run, sleep, until } from './harness.mjs'

const env = process.env
for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_DOMAIN']) {
  if (!env[k]) {
    console.error(`${k} is not set`)
    process.exit(2)
  }
}
if (env.E2B_DEBUG && env.E2B_DEBUG !== 'false') {
  console.error('E2B_DEBUG must be unset: it would bypass the API')
  process.exit(2)
}
const sdkVersion = JSON.parse(readFileSync(new URL('./node_modules/e2b/package.json', import.meta.url))).version
const runId = env.E2E_RUN_ID || String(Date.now())
const domain = env.E2B_DOMAIN
const sandboxUrl = env.E2B_SANDBOX_URL
const api = await recorder(env.E2B_API_URL)
env.E2B_API_URL = api.url

const slow = { requestTimeoutMs: 180_000 } // creates and resumes under TCG
const metadata = { suite: 'airlock-e2e', run: runId }
let sbx // the shared sandbox
let offline // the sandbox without internet access
let offlineCreate // its create, started next to the first one
const created = [] // every sandbox ID this script made

// routes returns the recorded control-plane calls since mark as
// "METHOD /path STATUS" strings, with the sandbox ID replaced by {id}.
function routes(mark, id) {
  return api
    .since(mark)
    .filter((e) => e.status) // answered ones
    .map((e) => `${e.method} ${e.path.split('?')[0].replaceAll(id, '{id}')} ${e.status}`)
}

// runBg starts a background command that lives as long as the test needs.
function runBg(sb, cmd, opts = {}) {
  return sb.commands.run(cmd, { background: true, timeoutMs: 600_000, ...opts })
}

const probePy = `
import json, socket, sys, urllib.request
name, ip = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
out = {}
try:
    out["dns"] = sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)})
except Exception as e:
    out["dns_error"] = repr(e)
try:
    with urllib.request.urlopen("http://%s/" % name, timeout=8) as r:
        out["http"] = {"status": r.status, "body": r.read().decode()}
except Exception as e:
    out["http_error"] = repr(e)
if ip:
    try:
        s = socket.create_connection((ip, 80), timeout=5)
        s.settimeout(5)
        s.sendall(("GET / HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n" % name).encode())
        data = s.recv(4096)
        out["raw"] = data.decode("utf-8", "replace")
    except Exception as e:
        out["raw_error"] = repr(e)
print(json.dumps(out))
`

async function probe(sb, name, ip = '') {
  await sb.files.write('/tmp/e2e-probe.py', probePy)
  const r = await sb.commands.run(`python3 /tmp/e2e-probe.py ${name} ${ip}`, { timeoutMs: 60_000 })
  return JSON.parse(r.stdout)
}

function egressEnv() {
  if (!env.E2E_EGRESS_ALLOWED) throw new Skip('no test host: the network namespace needs root (see e2e/testnet_test.go)')
  return { allowed: env.E2E_EGRESS_ALLOWED, denied: env.E2E_EGRESS_DENIED, ip: env.E2E_EGRESS_IP }
}

// snapshotsAndForks: E2B's snapshots and forks, which airlock makes as
// checkpoints. A sandbox with a file and a counting process is
// snapshotted; the snapshot is listed, a sandbox is made from it (the
// file there, the counter counting on), the source is forked (the file,
// its own hostname, its own random bytes), and the snapshot is deleted.
// Its sandboxes are its own and killed before it ends.
const snapshotCase = 'createSnapshot, listSnapshots, create from a snapshot, fork, deleteSnapshot'
async function snapshotsAndForks(log) {
  const mine = []
  const keep = (sb) => (mine.push(sb.sandboxId), created.push(sb.sandboxId), sb)
  try {
    const src = keep(await Sandbox.create('base', { ...slow, metadata: { ...metadata, role: 'snapshot-source' }, timeoutMs: 300_000 }))
    const id = src.sandboxId
    await src.files.write('/root/snap.txt', `snap ${runId}`)
    const counter = await runBg(src, 'i=0; while true; do i=$((i+1)); echo $i > /tmp/snapcount; sleep 0.2; done')
    await counter.disconnect()
    const count = async (sb) => Number((await sb.files.read('/tmp/snapcount').catch(() => '0')).trim())
    assert(await until(async () => (await count(src)) >= 2, 15_000), 'the counter must count before the snapshot')
    const random = async (sb) => (await sb.commands.run('head -c 16 /dev/urandom | od -An -tx1')).stdout.trim()
    const hostname = async (sb) => (await sb.commands.run('hostname')).stdout.trim()

    const mark = api.seen.length
    const name = `e2e-${runId}`
    let t0 = Date.now()
    const snap = await src.createSnapshot({ ...slow, name })
    log(`createSnapshot in ${Date.now() - t0} ms:`, snap)
    assert(/^chk[a-z0-9]+$/.test(snap.snapshotId), 'a snapshot ID is a checkpoint ID', snap)
    assert(snap.names.length === 1 && snap.names[0] === name, 'the snapshot names its name', snap)
    const listed = await src.listSnapshots().nextItems()
    assert(listed.some((x) => x.snapshotId === snap.snapshotId), "sandbox.listSnapshots() must show the sandbox's snapshot", listed)
    const byName = await Sandbox.listSnapshots({ name }).nextItems()
    assert(byName.length === 1 && byName[0].snapshotId === snap.snapshotId, 'Sandbox.listSnapshots({name}) must find it', byName)

    t0 = Date.now()
    const restored = keep(await Sandbox.create(snap.snapshotId, { ...slow, metadata, timeoutMs: 120_000 }))
    log(`Sandbox.create(snapshotId) in ${Date.now() - t0} ms: ${restored.sandboxId}`)
    equal(await restored.files.read('/root/snap.txt'), `snap ${runId}`, 'the file, in the sandbox made from the snapshot')
    const r0 = await count(restored)
    assert(await until(async () => (await count(restored)) > r0, 10_000, 300), 'the counter must count on in the sandbox made from the snapshot', { at: r0, now: await count(restored) })
    equal(await hostname(restored), restored.sandboxId, "hostname of the sandbox made from the snapshot (its own ID)")

    t0 = Date.now()
    const forks = await src.fork({ ...slow, count: 1, timeoutMs: 120_000 })
    log(`fork in ${Date.now() - t0} ms`)
    assert(forks.length === 1 && forks[0] instanceof Sandbox, 'fork({count: 1}) must give one sandbox', forks)
    const child = keep(forks[0])
    assert(child.sandboxId !== id && /^[a-z0-9]+$/.test(child.sandboxId), 'a fork has its own sandbox ID', child.sandboxId)
    equal(await child.files.read('/root/snap.txt'), `snap ${runId}`, 'the file, in the fork')
    equal(await hostname(child), child.sandboxId, 'hostname of the fork (its own ID)')
    const c0 = await count(child)
    assert(await until(async () => (await count(child)) > c0, 10_000, 300), 'the counter must count on in the fork', { at: c0, now: await count(child) })
    const bytes = { source: await random(src), restored: await random(restored), fork: await random(child) }
    log('/dev/urandom', bytes)
    assert(new Set(Object.values(bytes)).size === 3, 'the source, the sandbox from the snapshot and the fork must read different /dev/urandom bytes', bytes)
    const after = await src.listSnapshots().nextItems()
    assert(after.length === 1 && after[0].snapshotId === snap.snapshotId, 'a fork leaves no snapshot behind', after)

    // Bad input answers before anything is made.
    const e = await rejects(() => src.fork({ count: 101 }), 'fork({count: 101})')
    assert(String(e.message).startsWith('400:'), 'a count over 100 must answer 400', e)
    const nf = await rejects(() => Sandbox.create(`chk${'z'.repeat(20)}`, slow), 'Sandbox.create of an unknown snapshot')
    assert(String(nf.message).includes('404'), 'an unknown snapshot must answer 404', nf)

    equal(await Sandbox.deleteSnapshot(snap.snapshotId), true, 'deleteSnapshot of the snapshot')
    const gone = await Sandbox.listSnapshots({ sandboxId: id }).nextItems()
    assert(!gone.some((x) => x.snapshotId === snap.snapshotId), 'a deleted snapshot must not be listed', gone)
    equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'deleteSnapshot of a deleted snapshot')
    // The sandbox made from it runs on.
    equal(await restored.files.read('/root/snap.txt'), `snap ${runId}`, 'the file, after its snapshot was deleted')

    const calls = routes(mark, id).map((c) => c.replaceAll(snap.snapshotId, '{snapshot}'))
    log(calls)
    for (const want of ['POST /sandboxes/{id}/snapshots 201', 'GET /snapshots 200', 'POST /v2/sandboxes 201', 'POST /sandboxes/{id}/fork 201',
      'POST /sandboxes/{id}/fork 400', 'DELETE /templates/{snapshot} 204', 'DELETE /templates/{snapshot} 404']) {
      assert(calls.includes(want), `the SDK's calls must include ${want}`, calls)
    }
  } finally {
    for (const sid of mine) await Sandbox.kill(sid).catch(() => {})
  }
}

const cases = [
  {
    name: 'create',
    timeoutMs: 200_000,
    fn: async (log) => {
      equal(sdkVersion, '2.51.0', 'e2b SDK version')
      const mark = api.seen.length
      if (env.E2E_EGRESS_ALLOWED) {
        offlineCreate = Sandbox.create('base', { ...slow, allowInternetAccess: false, metadata: { ...metadata, role: 'offline' } })
        offlineCreate.catch(() => {})
      }
      sbx = await Sandbox.create('base', { ...slow, metadata, envs: { E2E_GREETING: 'hello from envs' }, timeoutMs: 300_000 })
      created.push(sbx.sandboxId)
      log('sandbox', sbx.sandboxId, 'domain', sbx.sandboxDomain)
      assert(/^[a-z0-9]+$/.test(sbx.sandboxId), 'sandbox ID must be lowercase letters and digits (the SDK splits hosts on "-")', sbx.sandboxId)
      equal(sbx.sandboxDomain, domain, 'sandbox domain (--e2b-domain)')
      const calls = routes(mark, sbx.sandboxId)
      log('routes', calls)
      assert(calls.includes('POST /v2/sandboxes 201'), 'create must be POST /v2/sandboxes answering 201', calls)
      assert(!calls.some((c) => c.startsWith('POST /sandboxes ')), 'SDK 2.51 must not use the v1 create', calls)
    },
  },
  {
    name: 'envs given at create',
    needs: ['create'],
    fn: async () => {
      const r = await sbx.commands.run('echo "$E2E_GREETING"')
      equal(r.stdout, 'hello from envs\n', 'stdout')
      const r2 = await sbx.commands.run('echo "$E2E_GREETING|$ONE"', { envs: { ONE: 'per command' } })
      equal(r2.stdout, 'hello from envs|per command\n', 'stdout with per-command envs')
    },
  },
  {
    name: 'commands.run foreground',
    needs: ['create'],
    fn: async () => {
      const r = await sbx.commands.run('echo out; echo err >&2; printf "%s" "$0"')
      equal(r.exitCode, 0, 'exit code')
      equal(r.stdout, 'out\n/bin/bash', 'stdout (the SDK runs /bin/bash -l -c)')
      equal(r.stderr, 'err\n', 'stderr')
      const cwd = await sbx.commands.run('pwd', { cwd: '/tmp' })
      equal(cwd.stdout, '/tmp\n', 'stdout of pwd with cwd /tmp')
      const py = await sbx.commands.run('python3 -c "print(6*7)"')
      equal(py.stdout, '42\n', 'python3 stdout')
    },
  },
  {
    name: 'commands.run non-zero exit',
    needs: ['create'],
    fn: async () => {
      const e = await rejects(() => sbx.commands.run('echo partial; echo boom >&2; exit 3'), 'a command exiting 3')
      assert(e instanceof CommandExitError, 'want CommandExitError', e)
      equal(e.exitCode, 3, 'exitCode')
      equal(e.stderr, 'boom\n', 'stderr')
      equal(e.stdout, 'partial\n', 'stdout')
      const r = await sbx.commands.run('echo still fine')
      equal(r.stdout, 'still fine\n', 'a command after the failed one')
    },
  },
  {
    name: 'commands.run background with onStdout, then kill',
    needs: ['create'],
    fn: async (log) => {
      let seen = ''
      const h = await runBg(sbx, 'for i in 1 2 3; do echo line$i; sleep 0.2; done; exec sleep 600', { onStdout: (d) => (seen += d) })
      assert(Number.isInteger(h.pid) && h.pid > 0, 'pid of the background command', h.pid)
      const got = await until(() => seen.includes('line3\n'), 20_000)
      assert(got, 'onStdout must receive line1..line3', seen)
      equal(seen, 'line1\nline2\nline3\n', 'stdout seen by onStdout')
      const listed = await sbx.commands.list()
      assert(listed.some((p) => p.pid === h.pid), `commands.list must show pid ${h.pid}`, listed)
      equal(await h.kill(), true, 'kill() of a running command')
      const end = await rejects(() => h.wait(), 'wait() of a killed command')
      log('wait after kill:', String(end))
      assert(end instanceof CommandExitError, 'wait() of a killed command must throw CommandExitError', end)
      assert(end.exitCode !== 0, 'exit code of a killed command must not be 0', end.exitCode)
      const gone = await until(async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid), 10_000)
      assert(gone, `pid ${h.pid} still listed after kill`, await sbx.commands.list())
      equal(await sbx.commands.kill(h.pid), false, 'commands.kill of a gone pid')
    },
  },
  {
    name: 'files write read list exists makeDir rename remove',
    needs: ['create'],
    fn: async () => {
      const dir = `/tmp/e2e-files-${runId}`
      const info = await sbx.files.write(`${dir}/a.txt`, 'hello files\n')
      equal(info.path, `${dir}/a.txt`, 'WriteInfo.path')
      equal(await sbx.files.read(`${dir}/a.txt`), 'hello files\n', 'read back')
      const bytes = new Uint8Array(256).map((_, i) => i)
      await sbx.files.write(`${dir}/bin.dat`, bytes.buffer)
      const back = await sbx.files.read(`${dir}/bin.dat`, { format: 'bytes' })
      assert(back.length === 256 && back.every((b, i) => b === i), 'every byte value must round-trip', back)
      const list = await sbx.files.list(dir)
      const names = list.map((e) => e.name).sort()
      equal(names.join(','), 'a.txt,bin.dat', 'names listed')
      const a = list.find((e) => e.name === 'a.txt')
      equal(a.type, FileType.FILE, 'type of a.txt')
      equal(a.path, `${dir}/a.txt`, 'path of a.txt')
      equal(a.size, 12, 'size of a.txt')
      equal(await sbx.files.exists(`${dir}/a.txt`), true, 'exists of a written file')
      equal(await sbx.files.exists(`${dir}/nope`), false, 'exists of a missing file')
      equal(await sbx.files.makeDir(`${dir}/sub`), true, 'makeDir of a new directory')
      equal(await sbx.files.makeDir(`${dir}/sub`), false, 'makeDir of an existing directory')
      const sub = (await sbx.files.list(dir)).find((e) => e.name === 'sub')
      equal(sub && sub.type, FileType.DIR, 'type of the made directory')
      const moved = await sbx.files.rename(`${dir}/a.txt`, `${dir}/sub/b.txt`)
      equal(moved.path, `${dir}/sub/b.txt`, 'path after rename')
      equal(await sbx.files.exists(`${dir}/a.txt`), false, 'old path after rename')
      equal(await sbx.files.read(`${dir}/sub/b.txt`), 'hello files\n', 'content after rename')
      await sbx.files.remove(`${dir}/sub/b.txt`)
      equal(await sbx.files.exists(`${dir}/sub/b.txt`), false, 'exists after remove')
      const e = await rejects(() => sbx.files.read(`${dir}/sub/b.txt`), 'read of a removed file')
      assert(e instanceof NotFoundError, 'read of a missing file must throw NotFoundError', e)
      const shell = await sbx.commands.run(`cat ${dir}/bin.dat | wc -c; ls ${dir}`)
      equal(shell.stdout, '256\nbin.dat\nsub\n', 'what a shell in the sandbox sees')
    },
  },
  {
    // envd 0.6.2: X-Metadata-* headers kept as user.e2b.* extended
    // attributes; keys come back lowercased, as E2B's envd keeps them.
    name: 'files.write with metadata, getInfo and list show it',
    needs: ['create'],
    fn: async (log) => {
      const dir = `/home/user/e2e-meta-${runId}` // on the disk: the guest's /tmp is a tmpfs, which keeps no user attributes
      const md = { author: 'e2e', Purpose: 'metadata test', run: runId }
      const want = { author: 'e2e', purpose: 'metadata test', run: runId }
      const same = (got) => JSON.stringify(Object.entries(got || {}).sort()) === JSON.stringify(Object.entries(want).sort())
      const info = await sbx.files.write(`${dir}/a.txt`, 'with metadata\n', { metadata: md })
      log('write', info)
      equal(info.path, `${dir}/a.txt`, 'WriteInfo.path')
      assert(same(info.metadata), 'WriteInfo.metadata must be what was sent, keys lowercased', info.metadata)
      const raw = await sbx.files.write(`${dir}/b.txt`, 'octet-stream\n', { metadata: md, useOctetStream: true })
      assert(same(raw.metadata), 'WriteInfo.metadata of an octet-stream upload', raw.metadata)
      const got = await sbx.files.getInfo(`${dir}/a.txt`)
      assert(same(got.metadata), 'files.getInfo().metadata', got)
      const list = await sbx.files.list(dir)
      for (const name of ['a.txt', 'b.txt']) {
        const e = list.find((x) => x.name === name)
        assert(e && same(e.metadata), `files.list() entry ${name} with its metadata`, list)
      }
      const shell = await sbx.commands.run(`python3 -c 'import os; print(os.getxattr("${dir}/a.txt", "user.e2b.author").decode())'`)
      equal(shell.stdout, 'e2e\n', 'the xattr a shell in the sandbox reads')
      await sbx.files.write(`${dir}/a.txt`, 'without\n')
      equal((await sbx.files.getInfo(`${dir}/a.txt`)).metadata, undefined, 'metadata after a write without any')
      // Within what the SDK checks, too large for a file: envd's 400.
      const e = await rejects(() => sbx.files.write(`${dir}/c.txt`, 'x', { metadata: { big: 'v'.repeat(5000) } }), 'write with 5000 bytes of metadata')
      assert(/at most 4000/.test(e.message), 'the refusal says the bound', e)
      equal(await sbx.files.exists(`${dir}/c.txt`), false, 'a refused write writes nothing')
    },
  },
  {
    // envd 0.6.3 and 0.6.4: entries on watch events, allowNetworkMounts.
    name: 'files.watchDir with includeEntry and allowNetworkMounts',
    needs: ['create'],
    fn: async (log) => {
      const dir = `/home/user/e2e-watch-entry-${runId}`
      await sbx.files.makeDir(dir)
      const events = []
      const w = await sbx.files.watchDir(dir, (ev) => events.push(ev), { timeoutMs: 60_000, includeEntry: true, allowNetworkMounts: true })
      try {
        await sleep(300)
        await sbx.files.write(`${dir}/new.txt`, 'x', { metadata: { step: 'one' } })
        const got = await until(() => events.some((ev) => ev.name === 'new.txt' && ev.entry), 15_000)
        log('events', events)
        assert(got, 'no event with an entry for new.txt', events)
        const ev = events.find((ev) => ev.name === 'new.txt' && ev.entry)
        equal(ev.entry.path, `${dir}/new.txt`, 'the event entry\'s path')
        equal(ev.entry.type, FileType.FILE, 'the event entry\'s type')
        equal(ev.entry.metadata && ev.entry.metadata.step, 'one', 'the event entry\'s metadata')
      } finally {
        await w.stop()
      }
    },
  },
  {
    name: 'files.watchDir',
    needs: ['create'],
    fn: async (log) => {
      const dir = `/tmp/e2e-watch-${runId}`
      await sbx.files.makeDir(dir)
      const events = []
      const w = await sbx.files.watchDir(dir, (ev) => events.push(ev), { timeoutMs: 60_000 })
      try {
        await sleep(300)
        await sbx.files.write(`${dir}/new.txt`, 'x')
        const got = await until(() => events.some((ev) => ev.name === 'new.txt'), 15_000)
        log('events', events)
        assert(got, 'no event for new.txt written after the watch started', events)
        const kinds = events.filter((ev) => ev.name === 'new.txt').map((ev) => ev.type)
        assert(kinds.includes('create') || kinds.includes('write'), 'new.txt events must include create or write', kinds)
      } finally {
        await w.stop()
      }
    },
  },
  {
    name: 'getInfo',
    needs: ['create'],
    fn: async (log) => {
      const info = await sbx.getInfo()
      log(info)
      equal(info.sandboxId, sbx.sandboxId, 'sandboxId')
      equal(info.state, 'running', 'state')
      equal(info.metadata.suite, metadata.suite, 'metadata.suite')
      equal(info.metadata.run, metadata.run, 'metadata.run')
      assert(info.templateId, 'templateId must be set', info)
      assert(info.startedAt instanceof Date && !isNaN(info.startedAt), 'startedAt', info.startedAt)
      assert(info.endAt > info.startedAt && info.endAt > new Date(), 'endAt must be after startedAt and in the future', info)
      assert(info.cpuCount >= 1 && info.memoryMB >= 64, 'cpuCount and memoryMB', info)
    },
  },
  {
    name: 'getMetrics',
    needs: ['create'],
    timeoutMs: 120_000,
    fn: async (log) => {
      const info = await sbx.getInfo()
      // The server samples every 5 s: wait for two samples, then check
      // the window picks them.
      let metrics = []
      await until(async () => (metrics = await sbx.getMetrics()).length >= 2, 90_000, 1000)
      log(metrics)
      assert(metrics.length >= 2, 'two samples within 90 s of sampling every 5 s', metrics)
      for (const m of metrics) {
        assert(m.timestamp instanceof Date && m.timestamp >= info.startedAt - 1000 && m.timestamp - new Date() < 5_000, 'timestamp since the start', m.timestamp)
        equal(m.cpuCount, info.cpuCount, 'cpuCount')
        assert(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, 'cpuUsedPct is a share', m.cpuUsedPct)
        assert(m.memTotal > (info.memoryMB - 64) * 2 ** 20 && m.memTotal <= info.memoryMB * 2 ** 20, 'memTotal is about the memory asked for', m.memTotal)
        assert(m.memUsed > 0 && m.memUsed < m.memTotal, 'memUsed', m.memUsed)
        assert(m.memCache >= 0, 'memCache', m.memCache)
        assert(m.diskTotal > 0 && m.diskUsed > 0 && m.diskUsed < m.diskTotal, 'disk', m)
      }
      for (let i = 1; i < metrics.length; i++) {
        assert(metrics[i].timestamp > metrics[i - 1].timestamp, 'samples oldest first, one per round', metrics.map((m) => m.timestamp))
      }
      // A window of the last sample's second alone holds that sample.
      const last = metrics[metrics.length - 1].timestamp
      const one = await sbx.getMetrics({ start: last, end: last })
      equal(one.length, 1, 'the samples of one second')
      equal(one[0].timestamp.getTime(), last.getTime(), 'the sample of that second')
      const later = await sbx.getMetrics({ start: new Date(metrics[0].timestamp.getTime() + 1000) })
      equal(later.length >= metrics.length - 1 && later.every((m) => m.timestamp > metrics[0].timestamp), true, 'start leaves out older samples')
      const past = await sbx.getMetrics({ start: new Date(Date.now() - 3_600_000), end: new Date(info.startedAt.getTime() - 60_000) })
      equal(past.length, 0, 'no samples before the sandbox started')
      const bad = await rejects(() => sbx.getMetrics({ start: new Date(), end: new Date(Date.now() - 60_000) }), 'getMetrics with start after end')
      assert(String(bad).includes('400') && String(bad).includes('after end'), 'start after end is a 400 naming it', String(bad))
    },
  },
  {
    name: 'commands.run with stdin: sendStdin, closeStdin',
    needs: ['create'],
    fn: async (log) => {
      let seen = ''
      const h = await runBg(sbx, 'cat', { stdin: true, onStdout: (d) => (seen += d) })
      await sbx.commands.sendStdin(h.pid, 'hello\n')
      assert(await until(() => seen === 'hello\n', 20_000), 'cat echoes the first input', seen)
      await h.sendStdin(new TextEncoder().encode('again\n'))
      assert(await until(() => seen === 'hello\nagain\n', 20_000), 'cat echoes the second input', seen)
      await sbx.commands.closeStdin(h.pid)
      const res = await h.wait()
      log(res)
      equal(res.exitCode, 0, 'cat ends on EOF with 0')
      equal(res.stdout, 'hello\nagain\n', 'stdout of cat')
      // Without stdin: true the command has no stdin to send to.
      const noIn = await runBg(sbx, 'sleep 600')
      const err = await rejects(() => sbx.commands.sendStdin(noIn.pid, 'x'), 'sendStdin to a command without stdin')
      log('sendStdin without stdin:', String(err))
      equal(await noIn.kill(), true, 'kill the command without stdin')
    },
  },
  {
    name: 'Sandbox.list by metadata',
    needs: ['create'],
    fn: async (log) => {
      const all = async (query) => {
        const p = Sandbox.list({ query })
        const out = []
        while (p.hasNext) out.push(...(await p.nextItems()))
        return out
      }
      const mine = await all({ metadata: { run: runId, suite: metadata.suite } })
      log(mine.map((s) => [s.sandboxId, s.state, s.metadata]))
      const me = mine.find((s) => s.sandboxId === sbx.sandboxId)
      assert(me, 'list by metadata must find the sandbox', mine)
      equal(me.state, 'running', 'listed state')
      equal(me.metadata.run, runId, 'listed metadata.run')
      assert(mine.every((s) => s.metadata.run === runId), 'every listed sandbox must match the filter', mine)
      const none = await all({ metadata: { run: `not-${runId}` } })
      assert(!none.some((s) => s.sandboxId === sbx.sandboxId), 'a metadata filter that does not match must not list it', none)
    },
  },
  {
    name: 'setTimeout',
    needs: ['create'],
    fn: async () => {
      const near = (d, s) => Math.abs(d.getTime() - (Date.now() + s * 1000)) < 20_000
      await sbx.setTimeout(900_000)
      const long = await sbx.getInfo()
      assert(near(long.endAt, 900), 'endAt after setTimeout(900 s) must be about now + 900 s', long.endAt)
      await sbx.setTimeout(600_000)
      const short = await sbx.getInfo()
      assert(near(short.endAt, 600), 'endAt after setTimeout(600 s) must be about now + 600 s (shortening works too)', short.endAt)
    },
  },
  {
    name: 'Sandbox.connect to a running sandbox',
    needs: ['create'],
    fn: async (log) => {
      const mark = api.seen.length
      const again = await Sandbox.connect(sbx.sandboxId, slow)
      equal(again.sandboxId, sbx.sandboxId, 'sandboxId')
      equal(await again.isRunning(), true, 'isRunning() (envd /health)')
      const calls = routes(mark, sbx.sandboxId)
      log(calls)
      assert(calls.includes('POST /v2/sandboxes/{id}/connect 200'), 'connect to a running sandbox must answer 200 on the v2 route', calls)
      equal((await again.commands.run('echo via connect')).stdout, 'via connect\n', 'stdout through the connected instance')
    },
  },
  {
    name: 'getHost and a guest HTTP port',
    needs: ['create'],
    timeoutMs: 90_000,
    fn: async (log) => {
      const host = sbx.getHost(8000)
      equal(host, `8000-${sbx.sandboxId}.${domain}`, 'getHost(8000)')
      const token = `served-${runId}`
      await sbx.files.write('/tmp/www/hello.txt', token)
      const srv = await runBg(sbx, 'cd /tmp/www && exec python3 -m http.server 8000 --bind 0.0.0.0')
      try {
        let last
        const ok = await until(async () => {
          try {
            last = await httpGet(sandboxUrl, host, '/hello.txt')
          } catch (e) {
            last = String(e)
          }
          return last.status === 200
        }, 45_000, 500)
        log('last answer', last)
        assert(ok, `GET /hello.txt with Host ${host} must answer 200`, last)
        equal(last.body, token, 'body served by the guest')
      } finally {
        await srv.kill()
      }
    },
  },
  {
    name: 'guest port with nothing listening answers 502',
    needs: ['create'],
    fn: async () => {
      const r = await httpGet(sandboxUrl, sbx.getHost(8011), '/')
      equal(r.status, 502, 'status for a closed guest port')
      const u = await httpGet(sandboxUrl, `8000-sbxnosuchsandbox0000000.${domain}`, '/')
      equal(u.status, 502, 'status for a port of a sandbox that does not exist')
    },
  },
  {
    name: 'internet access by default under --default-egress allow',
    needs: ['create'],
    timeoutMs: 90_000,
    fn: async (log) => {
      const { allowed, ip } = egressEnv()
      const p = await probe(sbx, allowed, ip)
      log(p)
      assert(p.dns && p.dns.includes(ip), `${allowed} must resolve to the test host ${ip}`, p)
      assert(p.http && p.http.status === 200 && p.http.body === `hello from ${allowed}\n`, `GET http://${allowed}/ must reach the test host`, p)
    },
  },
  {
    name: 'allowInternetAccess false blocks egress',
    needs: ['create'],
    timeoutMs: 200_000,
    fn: async (log) => {
      const { denied, ip } = egressEnv()
      offline = await offlineCreate
      created.push(offline.sandboxId)
      log('offline sandbox', offline.sandboxId)
      const p = await probe(offline, denied, ip)
      log(p)
      assert(!p.dns && p.dns_error, `${denied} must not resolve without internet access`, p)
      assert(!p.http && p.http_error, `GET http://${denied}/ must fail without internet access`, p)
      assert(!(p.raw || '').includes('hello from'), `a raw connection to ${ip}:80 must not reach the test host`, p)
      const info = await offline.getInfo()
      equal(info.allowInternetAccess, false, 'getInfo().allowInternetAccess of the offline sandbox')
    },
  },
  {
    name: 'pause, then Sandbox.connect resumes it',
    needs: ['create'],
    timeoutMs: 240_000,
    fn: async (log) => {
      const id = sbx.sandboxId
      await sbx.files.write('/root/before-pause.txt', `kept ${runId}`)
      const counter = await runBg(sbx, 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.3; done')
      await counter.disconnect()
      const n0 = await until(async () => Number((await sbx.files.read('/tmp/counter').catch(() => '0')).trim()) >= 2, 15_000)
      assert(n0, 'the counter must be counting before the pause')
      const mark = api.seen.length
      equal(await sbx.pause(), true, 'pause() of a running sandbox')
      const paused = await Sandbox.getInfo(id)
      equal(paused.state, 'paused', 'state after pause')
      equal(await sbx.pause(), false, 'pause() of a paused sandbox')
      equal(await sbx.isRunning(), false, 'isRunning() of a paused sandbox (envd /health must answer 502)')
      const listed = Sandbox.list({ query: { metadata: { run: runId }, state: ['paused'] } })
      const pausedList = await listed.nextItems()
      assert(pausedList.some((s) => s.sandboxId === id), 'list with state paused must show it', pausedList)
      const t0 = Date.now()
      const back = await Sandbox.connect(id, slow)
      log(`resumed in ${Date.now() - t0} ms`)
      const calls = routes(mark, id)
      log(calls)
      assert(calls.includes('POST /sandboxes/{id}/pause 204'), 'pause must answer 204', calls)
      assert(calls.includes('POST /sandboxes/{id}/pause 409'), 'a second pause must answer 409', calls)
      assert(calls.includes('POST /v2/sandboxes/{id}/connect 201'), 'connect of a paused sandbox must resume it on the v2 route with 201', calls)
      equal((await back.getInfo()).state, 'running', 'state after connect')
      equal(await back.files.read('/root/before-pause.txt'), `kept ${runId}`, 'a file written before the pause')
      const procs = await back.commands.list()
      assert(procs.some((p) => p.pid === counter.pid), `commands.list must still show the counter (pid ${counter.pid})`, procs)
      const read = async () => Number((await back.files.read('/tmp/counter')).trim())
      const a = await read()
      const grew = await until(async () => (await read()) > a, 10_000, 500)
      assert(grew, 'the counter started before the pause must go on counting after it', { before: a, now: await read() })
      equal(await back.commands.kill(counter.pid), true, 'kill of the counter')
      sbx = back
    },
  },
  {
    name: 'kill, and kill of a gone sandbox',
    needs: ['create'],
    timeoutMs: 120_000,
    fn: async (log) => {
      const id = sbx.sandboxId
      const mark = api.seen.length
      equal(await sbx.kill(), true, 'kill() of a live sandbox')
      equal(await Sandbox.kill(id), false, 'Sandbox.kill of a killed sandbox')
      const calls = routes(mark, id)
      log(calls)
      assert(calls[0] === 'DELETE /sandboxes/{id} 204', 'kill must answer 204', calls)
      const e = await rejects(() => Sandbox.getInfo(id), 'getInfo of a killed sandbox')
      assert(e instanceof SandboxNotFoundError, 'getInfo of a killed sandbox must throw SandboxNotFoundError (a 404 whose body has code 404)', e)
      const c = await rejects(() => Sandbox.connect(id, slow), 'connect to a killed sandbox')
      assert(c instanceof SandboxNotFoundError, 'connect to a killed sandbox must throw SandboxNotFoundError', c)
      const mine = await Sandbox.list({ query: { metadata: { run: runId } } }).nextItems()
      assert(!mine.some((s) => s.sandboxId === id), 'a killed sandbox must not be listed', mine)
      equal(await Sandbox.kill('sbxnosuchsandbox0000000'), false, 'Sandbox.kill of an ID that never existed')
    },
  },
  {
    name: 'isRunning after kill',
    needs: ['kill, and kill of a gone sandbox'],
    fn: async () => {
      equal(await sbx.isRunning(), false, 'isRunning() of a killed sandbox (envd /health must answer 502)')
    },
  },
  { name: snapshotCase, timeoutMs: 240_000, fn: snapshotsAndForks },
]

// lifecycle.autoResume: a sandbox its timeout paused resumes on envd
// traffic, in a sandbox of its own (kept apart from the cases above).
const autoResumeCases = [
  {
    name: 'lifecycle autoResume: traffic resumes a sandbox its timeout paused',
    timeoutMs: 360_000,
    fn: async (log) => {
      const lc = { onTimeout: 'pause', autoResume: true }
      const s = await Sandbox.create('base', { ...slow, metadata: { ...metadata, role: 'autoresume' }, timeoutMs: 5_000, lifecycle: lc })
      created.push(s.sandboxId)
      try {
        await s.files.write('/root/before-timeout.txt', `kept ${runId}`)
        const info = await Sandbox.getInfo(s.sandboxId)
        equal(info.lifecycle?.autoResume, true, 'lifecycle.autoResume in getInfo')
        const paused = await until(async () => (await Sandbox.getInfo(s.sandboxId)).state === 'paused', 120_000, 500)
        assert(paused, 'the timeout must pause the sandbox', await Sandbox.getInfo(s.sandboxId))
        const t0 = Date.now()
        const r = await s.commands.run('cat /root/before-timeout.txt', { requestTimeoutMs: 180_000 })
        log('the first command after the pause answered in', Date.now() - t0, 'ms')
        equal(r.stdout, `kept ${runId}`, 'stdout of a command on the paused sandbox')
        equal((await Sandbox.getInfo(s.sandboxId)).state, 'running', 'state after the traffic')
      } finally {
        await Sandbox.kill(s.sandboxId).catch(() => {})
      }
    },
  },
]
cases.push(...autoResumeCases)

let code = 1
try {
  code = await run(cases, () => ({ sandboxes: created }))
} finally {
  // Whatever failed, leave nothing behind.
  const live = [sbx, offline, await offlineCreate?.catch(() => undefined)].filter(Boolean)
  for (const s of new Set(live.map((s) => s.sandboxId))) await Sandbox.kill(s).catch(() => {})
  api.close()
}
process.exit(code ? 1 : 0)
