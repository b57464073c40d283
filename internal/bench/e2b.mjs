// E2B's JavaScript SDK (npm e2b) timed against airlock's E2B API, for the
// e2b_ scenarios of `airlock bench` (internal/bench/e2b.go), which embeds
// this file, writes it next to a link to the SDK's node_modules and runs it
// with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.
//
//	node e2b.mjs create TEMPLATE
//	    Sandbox.create(TEMPLATE), then commands.run('echo hi') until its
//	    first stdout; one sample, then the sandbox is killed (untimed).
//	node e2b.mjs exec TEMPLATE CMD
//	    Sandbox.create(TEMPLATE), then one commands.run(CMD) per line
//	    "run" read on stdin, each timed; "quit" or the end of stdin kills
//	    the sandbox.
//
// Every message is one line on stdout: "BENCH " and a JSON object with
// some of sandbox (the ID, once created), ms (one sample, in milliseconds),
// killed (true once the sandbox is gone) and error (why it failed; the
// script then exits 1).

import { Sandbox } from 'e2b'
import { createInterface } from 'node:readline'

const [mode, template, cmd] = process.argv.slice(2)
const say = (m) => process.stdout.write('BENCH ' + JSON.stringify(m) + '\n')
const now = () => Number(process.hrtime.bigint()) / 1e6
const slow = { requestTimeoutMs: 180_000 } // creates under TCG
const runOpts = { timeoutMs: 30_000, requestTimeoutMs: 30_000 }

let sbx
async function create() {
  sbx = await Sandbox.create(template, slow)
  say({ sandbox: sbx.sandboxId })
}

async function firstOutput() {
  const start = now()
  await create()
  let first
  const r = await sbx.commands.run('echo hi', {
    ...runOpts,
    onStdout: (data) => {
      if (first === undefined && data.length > 0) first = now()
    },
  })
  if (r.stdout !== 'hi\n') throw new Error(`echo hi wrote ${JSON.stringify(r.stdout)} to stdout`)
  if (first === undefined) throw new Error('echo hi returned without an onStdout callback')
  say({ ms: first - start })
}

async function execs() {
  await create()
  const lines = createInterface({ input: process.stdin })
  for await (const line of lines) {
    if (line === 'quit') break
    if (line !== 'run') throw new Error(`unknown request ${JSON.stringify(line)}`)
    const start = now()
    const r = await sbx.commands.run(cmd, runOpts)
    const ms = now() - start
    if (r.exitCode !== 0) throw new Error(`${cmd} exited with ${r.exitCode}: ${r.stderr}`)
    say({ ms })
  }
}

let failed = false
try {
  if (mode === 'create') await firstOutput()
  else if (mode === 'exec' && cmd) await execs()
  else throw new Error(`usage: node e2b.mjs create TEMPLATE | exec TEMPLATE CMD (got ${process.argv.slice(2).join(' ')})`)
} catch (e) {
  failed = true
  say({ error: String(e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e) })
}
if (sbx) {
  try {
    await sbx.kill()
    say({ killed: true })
  } catch (e) {
    failed = true
    say({ error: `kill sandbox ${sbx.sandboxId}: ${e}` })
  }
}
process.exit(failed ? 1 : 0)
