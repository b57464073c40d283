// E2B's code interpreter SDK (npm @e2b/code-interpreter, pinned in
// package.json) against airlock's E2B-compatible API: runCode through the
// server on guest port 49999 of the built-in code-interpreter template
// (E2B's template name code-interpreter-v1, the SDK's default). Same
// environment as sdk.mjs; e2e/e2b_sdk_test.go runs it only when the server
// lists a template named code-interpreter.

import { Sandbox } from '@e2b/code-interpreter'
import { readFileSync } from 'node:fs'
import { assert, equal, run } from './harness.mjs'

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_DOMAIN']) {
  if (!process.env[k]) {
    console.error(`${k} is not set`)
    process.exit(2)
  }
}
const version = JSON.parse(readFileSync(new URL('./node_modules/@e2b/code-interpreter/package.json', import.meta.url))).version
const runId = process.env.E2E_RUN_ID || String(Date.now())
let sbx

const cases = [
  {
    name: 'create code-interpreter sandbox',
    timeoutMs: 200_000,
    fn: async (log) => {
      equal(version, '2.8.0', '@e2b/code-interpreter version')
      sbx = await Sandbox.create({ requestTimeoutMs: 180_000, metadata: { suite: 'airlock-e2e', run: runId, role: 'code-interpreter' } })
      log('sandbox', sbx.sandboxId)
    },
  },
  {
    name: 'runCode stdout',
    needs: ['create code-interpreter sandbox'],
    timeoutMs: 120_000,
    fn: async (log) => {
      const seen = []
      const ex = await sbx.runCode('print("hello from python")\nprint("second line")', { onStdout: (m) => seen.push(m.line) })
      log(ex.toJSON())
      equal(ex.error, undefined, 'error')
      equal(ex.logs.stdout.join(''), 'hello from python\nsecond line\n', 'logs.stdout')
      assert(seen.join('').includes('hello from python'), 'onStdout must see the output', seen)
    },
  },
  {
    name: 'runCode main result',
    needs: ['create code-interpreter sandbox'],
    fn: async (log) => {
      const ex = await sbx.runCode('x = 41\nx + 1')
      log(ex.toJSON())
      equal(ex.error, undefined, 'error')
      equal(ex.text, '42', 'execution.text')
      const main = ex.results.filter((r) => r.isMainResult)
      equal(main.length, 1, 'number of main results')
      equal(main[0].text, '42', 'text of the main result')
      const none = await sbx.runCode('y = 1')
      equal(none.text, undefined, 'text of a statement without a value')
    },
  },
  {
    name: 'runCode error',
    needs: ['create code-interpreter sandbox'],
    fn: async (log) => {
      const ex = await sbx.runCode('def f():\n    return 1 / 0\nf()')
      log(ex.toJSON())
      assert(ex.error, 'execution.error must be set', ex.toJSON())
      equal(ex.error.name, 'ZeroDivisionError', 'error name')
      assert(/division by zero/.test(ex.error.value), 'error value', ex.error.value)
      // Jupyter's tracebacks carry ANSI colours; E2B passes them on.
      const tb = ex.error.traceback.replace(/\x1b\[[0-9;]*m/g, '')
      assert(/ZeroDivisionError/.test(tb) && /1 \/ 0/.test(tb), 'traceback must name the error and show the failing line', tb)
      const after = await sbx.runCode('"still works"')
      equal(after.text, 'still works', 'a run after the error')
    },
  },
  {
    name: 'runCode PNG chart',
    needs: ['create code-interpreter sandbox'],
    timeoutMs: 120_000,
    fn: async (log) => {
      const ex = await sbx.runCode(
        'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()',
        { timeoutMs: 110_000 },
      )
      log({ error: ex.error, formats: ex.results.map((r) => r.formats()), chart: ex.results.map((r) => r.chart) })
      equal(ex.error, undefined, 'error')
      const png = ex.results.find((r) => r.png)
      assert(png, 'a result with a PNG', ex.results.map((r) => r.formats()))
      const bytes = Buffer.from(png.png, 'base64')
      assert(bytes.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'the PNG must start with the PNG signature', bytes.subarray(0, 8))
      assert(bytes.length > 1000, 'the PNG must hold a picture', bytes.length)
    },
  },
  {
    name: 'code context keeps state',
    needs: ['create code-interpreter sandbox'],
    timeoutMs: 120_000,
    fn: async (log) => {
      const ctx = await sbx.createCodeContext()
      log(ctx)
      assert(ctx.id, 'context id', ctx)
      equal((await sbx.runCode('kept = 6', { context: ctx })).error, undefined, 'error setting state')
      const ex = await sbx.runCode('kept * 7', { context: ctx })
      equal(ex.text, '42', 'state kept in the context')
      const other = await sbx.runCode('kept')
      assert(other.error && other.error.name === 'NameError', 'the default context must not see the other context\'s state', other.toJSON())
      const listed = await sbx.listCodeContexts()
      assert(listed.some((c) => c.id === ctx.id), 'listCodeContexts must show the context', listed)
      await sbx.removeCodeContext(ctx)
    },
  },
  {
    // Both kernels were started in the template snapshot: each sandbox
    // must still draw its own random numbers.
    name: 'two sandboxes draw different random numbers',
    needs: ['create code-interpreter sandbox'],
    timeoutMs: 200_000,
    fn: async (log) => {
      const other = await Sandbox.create({ requestTimeoutMs: 180_000, metadata: { suite: 'airlock-e2e', run: runId, role: 'code-interpreter-2' } })
      try {
        const code = 'import random, os\nprint(random.random(), os.urandom(8).hex())'
        const a = (await sbx.runCode(code)).logs.stdout.join('')
        const b = (await other.runCode(code)).logs.stdout.join('')
        log({ a, b })
        assert(a.trim() !== '' && b.trim() !== '', 'both printed', { a, b })
        const [ra, ua] = a.trim().split(' ')
        const [rb, ub] = b.trim().split(' ')
        assert(ra !== rb, 'random.random() must differ between sandboxes', { a, b })
        assert(ua !== ub, 'os.urandom must differ between sandboxes', { a, b })
      } finally {
        await other.kill()
      }
    },
  },
  {
    name: 'kill code-interpreter sandbox',
    needs: ['create code-interpreter sandbox'],
    fn: async () => {
      equal(await sbx.kill(), true, 'kill()')
      sbx = undefined
    },
  },
]

let code = 1
try {
  code = await run(cases)
} finally {
  if (sbx) await sbx.kill().catch(() => {})
}
process.exit(code ? 1 : 0)
