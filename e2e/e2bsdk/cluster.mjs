// E2B's JavaScript SDK against two API replicas of an airlock cluster on
// Kubernetes, neither of which runs a VM: every call on the sandbox must
// reach the node that runs it. Run by TestClusterE2B (e2e/cluster_test.go),
// which sets:
//
//	E2E_REPLICA_ONE, E2E_REPLICA_TWO  http://ADDR of each replica's --e2b-listen
//	E2B_API_KEY                       an e2b_ key of the cluster's store
//	E2B_DOMAIN                        e2b.test
//
// The sandbox is made through one replica and then driven through the
// other, as a client whose replica died would be.

import { Sandbox, SandboxNotFoundError } from 'e2b'
import { assert, equal, rejects, run } from './harness.mjs'

const env = process.env
for (const k of ['E2E_REPLICA_ONE', 'E2E_REPLICA_TWO', 'E2B_API_KEY', 'E2B_DOMAIN']) {
  if (!env[k]) {
    console.error(`${k} is not set`)
    process.exit(2)
  }
}
const through = (url) => ({ apiUrl: url, sandboxUrl: url, requestTimeoutMs: 180_000 })
const one = through(env.E2E_REPLICA_ONE)
const two = through(env.E2E_REPLICA_TWO)
const created = []
let sbx // as replica one sees it
let other // the same sandbox through replica two

const cases = [
  {
    name: 'create through replica one',
    timeoutMs: 200_000,
    fn: async (log) => {
      sbx = await Sandbox.create('base', { ...one, metadata: { suite: 'airlock-e2e-cluster' }, timeoutMs: 300_000 })
      created.push(sbx.sandboxId)
      log('sandbox', sbx.sandboxId)
      const r = await sbx.commands.run('echo made through one')
      equal(r.stdout, 'made through one\n', 'stdout')
    },
  },
  {
    name: 'connect, commands and files through replica two',
    needs: ['create through replica one'],
    timeoutMs: 120_000,
    fn: async () => {
      other = await Sandbox.connect(sbx.sandboxId, two)
      await other.files.write('/tmp/from-two.txt', 'written through two')
      equal(await sbx.files.read('/tmp/from-two.txt'), 'written through two', 'read through one')
      const r = await other.commands.run('cat /tmp/from-two.txt; echo; echo $((6 * 7))')
      equal(r.stdout, 'written through two\n42\n', 'stdout through two')
      const entries = await other.files.list('/tmp')
      assert(entries.some((e) => e.name === 'from-two.txt'), 'list through two shows the file', entries)
    },
  },
  {
    name: 'a background command streams through replica two',
    needs: ['connect, commands and files through replica two'],
    timeoutMs: 60_000,
    fn: async () => {
      const lines = []
      const h = await other.commands.run('for i in 1 2 3; do echo line $i; sleep 0.2; done', {
        background: true,
        onStdout: (d) => lines.push(d),
      })
      const res = await h.wait()
      equal(res.exitCode, 0, 'exit code')
      equal(lines.join(''), 'line 1\nline 2\nline 3\n', 'streamed stdout')
    },
  },
  {
    name: 'info and list through replica two',
    needs: ['create through replica one'],
    fn: async () => {
      const info = await Sandbox.getInfo(sbx.sandboxId, two)
      equal(info.sandboxId, sbx.sandboxId, 'sandboxId')
      equal(info.state, 'running', 'state')
      const page = await Sandbox.list({ ...two, query: { metadata: { suite: 'airlock-e2e-cluster' } } }).nextItems()
      assert(page.some((s) => s.sandboxId === sbx.sandboxId), 'the list through two has it', page)
    },
  },
  {
    name: 'kill through replica two',
    needs: ['create through replica one'],
    timeoutMs: 120_000,
    fn: async () => {
      equal(await Sandbox.kill(sbx.sandboxId, two), true, 'kill')
      const e = await rejects(() => Sandbox.connect(sbx.sandboxId, one), 'connect through one to the killed sandbox')
      assert(e instanceof SandboxNotFoundError || /not found/i.test(String(e)), 'not found', String(e))
    },
  },
]

const failed = await run(cases, () => ({ sandboxes: created }))
process.exit(failed ? 1 : 0)
