// E2B's code interpreter SDK (npm @e2b/code-interpreter, pinned in
// package.json) against airlock's E2B-compatible API: runCode through the
// server on guest port 49999 of the built-in code-interpreter template
// (E2B's template name code-interpreter-v1, the SDK's default). Same
// environment as sdk.mjs; e2e/e2b_sdk_test.go runs it only when the server
// lists a template named code-interpreter.

import { Sandbox } from '@e2b/code-interpreter'
import { readFileSync } from 'node:fs'
import { assert, equal, rejects, run } from './harness.mjs'

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
  ...languageCases(),
  {
    name: 'an unknown language is refused',
    needs: ['create code-interpreter sandbox'],
    fn: async (log) => {
      for (const language of ['cobol', 'java']) {
        const err = await rejects(() => sbx.runCode('1', { language }), `runCode in ${language}`)
        log(language, String(err))
        assert(/400/.test(String(err)), `runCode in ${language} must fail with 400`, String(err))
        const err2 = await rejects(() => sbx.createCodeContext({ language }), `createCodeContext in ${language}`)
        assert(/400/.test(String(err2)), `createCodeContext in ${language} must fail with 400`, String(err2))
      }
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

// The languages besides Python, each in a context of its own: state
// kept, output streamed as it is printed, an error with its traceback,
// a result with its MIME data, its alias, restart, list and delete.
// The first run of each starts its interpreter (TypeScript's checker
// loads its library then), which takes long under emulation.
function languageCases() {
  const languages = [
    {
      language: 'javascript', alias: 'js', aliasCode: '[1, 2].map((x) => x * 2)', aliasText: '[ 2, 4 ]',
      set: 'let kept = await Promise.resolve(6)', get: 'kept * 7', kept: '42',
      stream: "console.log('out'); await new Promise((r) => setTimeout(r, 1500)); console.error('err')",
      fail: 'function f() { return null.x }\nf()', errName: 'TypeError', trace: /at f \(cell\.js/,
      value: '({ a: [1, 2] })', mime: (r) => JSON.stringify(r.json) === '{"a":[1,2]}',
    },
    {
      language: 'typescript', alias: 'ts', aliasCode: 'const n: number = 2\nn + 1', aliasText: '3',
      set: 'const kept: number = 6', get: 'kept * 7', kept: '42',
      stream: "console.log('out'); await new Promise<void>((r) => setTimeout(r, 1500)); console.error('err')",
      fail: 'const s: string = kept', errName: 'TSError', trace: /cell\.ts\(1,7\): error TS2322/,
      value: 'interface P { a: number[] }\nconst p: P = { a: [1, 2] }\np', mime: (r) => JSON.stringify(r.json) === '{"a":[1,2]}',
    },
    {
      language: 'bash', aliasCode: 'echo $((6 * 7))', aliasStdout: '42\n',
      set: 'kept=42; cd /tmp', get: 'echo "$kept $PWD"', keptStdout: '42 /tmp\n',
      stream: 'echo out; sleep 1.5; echo err >&2',
      fail: 'ls /nonexistent-dir', errName: 'CommandExitError', trace: /nonexistent-dir/,
    },
    {
      language: 'r', aliasCode: 'sum(1:3)', aliasText: '[1] 6',
      set: 'kept <- 6', get: 'kept * 7', kept: '[1] 42',
      stream: "cat('out\\n'); Sys.sleep(1.5); message('err')",
      fail: "f <- function() stop('boom')\nf()", errName: 'ERROR', trace: /boom/,
      value: 'data.frame(a = 1:2)', mime: (r) => /<table/.test(r.html || ''),
    },
  ]
  const slow = { timeoutMs: 280_000, requestTimeoutMs: 280_000 }
  return languages.map((l) => ({
    name: `${l.language}: context state, streamed output, error, result, restart`,
    needs: ['create code-interpreter sandbox'],
    timeoutMs: 600_000,
    fn: async (log) => {
      // The language's default context, by its name or alias.
      const first = await sbx.runCode(l.aliasCode, { language: l.alias || l.language, ...slow })
      log('default context', first.toJSON())
      equal(first.error, undefined, 'error in the default context')
      if (l.aliasText) equal(first.text, l.aliasText, 'text in the default context')
      else equal(first.logs.stdout.join(''), l.aliasStdout, 'stdout in the default context')

      const ctx = await sbx.createCodeContext({ language: l.language, ...slow })
      log('context', ctx)
      equal(ctx.language, l.language, 'language of the context')
      const set = await sbx.runCode(l.set, { context: ctx, ...slow })
      equal(set.error, undefined, 'error setting state')
      const got = async () => {
        const ex = await sbx.runCode(l.get, { context: ctx, ...slow })
        return l.kept ? ex.text : ex.logs.stdout.join('')
      }
      equal(await got(), l.kept || l.keptStdout, 'state kept in the context')

      // Output comes as it is printed: "out" well before the run ends.
      const seen = []
      const start = Date.now()
      let outAt
      const streamed = await sbx.runCode(l.stream, {
        context: ctx,
        ...slow,
        onStdout: (m) => { seen.push(['stdout', m.line]); outAt ??= Date.now() },
        onStderr: (m) => seen.push(['stderr', m.line]),
      })
      const end = Date.now()
      log('stream', { seen, outMs: outAt - start, endMs: end - start })
      equal(streamed.error, undefined, 'error in the streaming run')
      assert(seen.some(([k, v]) => k === 'stdout' && v.includes('out')), 'onStdout must see out', seen)
      assert(seen.some(([k, v]) => k === 'stderr' && v.includes('err')), 'onStderr must see err', seen)
      assert(outAt !== undefined && end - outAt >= 1000, 'out must arrive before the 1.5 s wait ends', { outMs: outAt - start, endMs: end - start })

      const failed = await sbx.runCode(l.fail, { context: ctx, ...slow })
      log('error', failed.error)
      assert(failed.error, 'execution.error must be set', failed.toJSON())
      equal(failed.error.name, l.errName, 'error name')
      assert(failed.error.value, 'error value', failed.error)
      const tb = failed.error.traceback.replace(/\x1b\[[0-9;]*m/g, '')
      assert(l.trace.test(tb), `traceback must match ${l.trace}`, tb)
      equal(await got(), l.kept || l.keptStdout, 'state after the error')

      if (l.value) {
        const ex = await sbx.runCode(l.value, { context: ctx, ...slow })
        const main = ex.results.find((r) => r.isMainResult)
        log('result', main && main.formats())
        assert(main && l.mime(main), 'a main result with its MIME data', ex.results.map((r) => r.toJSON()))
      }

      const listed = await sbx.listCodeContexts()
      assert(listed.some((c) => c.id === ctx.id && c.language === l.language), 'listCodeContexts must show the context', listed)
      await sbx.restartCodeContext(ctx)
      assert(await got() !== (l.kept || l.keptStdout), 'a restart must drop the state')
      await sbx.removeCodeContext(ctx)
      const after = await sbx.listCodeContexts()
      assert(!after.some((c) => c.id === ctx.id), 'removeCodeContext must remove the context', after)
    },
  }))
}

let code = 1
try {
  code = await run(cases)
} finally {
  if (sbx) await sbx.kill().catch(() => {})
}
process.exit(code ? 1 : 0)
