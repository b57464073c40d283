// The MCP TypeScript SDK's own clients against airlock's MCP server: the
// stdio client spawning `airlock mcp`, and the streamable HTTP client
// against POST /v1/mcp. Driven by e2e/mcp_test.go, which sets
//
//   AIRLOCK_URL, AIRLOCK_API_KEY   the server and a user key
//   AIRLOCK_OTHER_KEY              a second user key (tenancy)
//   AIRLOCK                        the airlock binary
//   E2E_CODE_INTERPRETER=1         when the code-interpreter template is there
//
// Each case prints one line through ../e2bsdk/harness.mjs.

import { createHash } from 'node:crypto'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { run, assert, equal, fail, Skip, until } from '../e2bsdk/harness.mjs'

const url = process.env.AIRLOCK_URL
const key = process.env.AIRLOCK_API_KEY
const otherKey = process.env.AIRLOCK_OTHER_KEY
const airlock = process.env.AIRLOCK

const allTools = ['create_sandbox', 'run_command', 'read_command_output', 'write_file', 'read_file', 'list_files',
  'list_sandboxes', 'delete_sandbox', 'run_code', 'checkpoint_sandbox', 'fork_sandbox', 'expose_port']

function httpTransport(k) {
  const headers = k ? { Authorization: `Bearer ${k}` } : {}
  return new StreamableHTTPClientTransport(new URL(`${url}/v1/mcp`), { requestInit: { headers } })
}

async function connect(transport) {
  const c = new Client({ name: 'airlock-e2e', version: '1.0.0' })
  await c.connect(transport)
  return c
}

// call calls a tool that must succeed and returns its structured result.
async function call(c, name, args) {
  const r = await c.callTool({ name, arguments: args })
  if (r.isError) fail(`${name} ${JSON.stringify(args).slice(0, 200)} failed`, r.content)
  assert(r.structuredContent, `${name} returned no structured content`, r)
  return r.structuredContent
}

// callError calls a tool that must fail and returns its message.
async function callError(c, name, args) {
  const r = await c.callTool({ name, arguments: args })
  if (!r.isError) fail(`${name} ${JSON.stringify(args).slice(0, 200)} did not fail`, r)
  return r.content.map((x) => x.text || '').join('')
}

let stdio, stdioTransport, http, other
let sbx, child, ci
const stderrLines = []

const cases = [
  {
    name: 'stdio: airlock mcp starts and lists every tool',
    fn: async (log) => {
      stdioTransport = new StdioClientTransport({
        command: airlock, args: ['mcp'],
        env: { ...process.env, AIRLOCK_URL: url, AIRLOCK_API_KEY: key },
        stderr: 'pipe',
      })
      stdioTransport.stderr.on('data', (d) => stderrLines.push(String(d)))
      stdio = await connect(stdioTransport)
      const info = stdio.getServerVersion()
      equal(info.name, 'airlock', 'server name')
      const { tools } = await stdio.listTools()
      const names = tools.map((t) => t.name)
      for (const t of allTools) assert(names.includes(t), `no tool ${t}`, names)
      for (const t of tools) assert(t.inputSchema && t.outputSchema, `tool ${t.name} lacks a schema`, t)
      log(`tools: ${names.join(', ')}`)
    },
  },
  {
    name: 'stdio: create_sandbox and run_command',
    needs: ['stdio: airlock mcp starts and lists every tool'],
    fn: async (log) => {
      const sb = await call(stdio, 'create_sandbox', { template: 'base', timeout_s: 600 })
      equal(sb.state, 'running', 'state')
      sbx = sb.sandbox_id
      log(`sandbox ${sbx}`)
      const ok = await call(stdio, 'run_command', { sandbox_id: sbx, command: 'echo hello; echo $GREETING from $(pwd)', env: { GREETING: 'hi' }, cwd: '/tmp' })
      equal(ok.exit_code, 0, 'exit code')
      equal(ok.stdout, 'hello\nhi from /tmp\n', 'stdout')
      // A failing command is a result, not an MCP error.
      const bad = await call(stdio, 'run_command', { sandbox_id: sbx, command: 'echo oops >&2; exit 7' })
      equal(bad.exit_code, 7, 'a failing command\'s exit code')
      equal(bad.stderr, 'oops\n', 'a failing command\'s stderr')
      const slow = await call(stdio, 'run_command', { sandbox_id: sbx, command: 'sleep 30', timeout_s: 1 })
      assert(slow.timed_out, 'a command past timeout_s is killed', slow)
    },
  },
  {
    name: 'stdio: long output is cut and read_command_output reads it whole',
    needs: ['stdio: create_sandbox and run_command'],
    fn: async () => {
      const r = await call(stdio, 'run_command', { sandbox_id: sbx, command: 'seq 1 30000' })
      let want = ''
      for (let i = 1; i <= 30000; i++) want += `${i}\n`
      assert(r.truncated && r.note.includes(r.command_id), 'long output is marked cut with a note', r.note)
      equal(r.stdout_bytes, want.length, 'the whole size')
      assert(r.stdout.startsWith('1\n2\n3\n') && r.stdout.endsWith('29999\n30000\n'), 'head and tail kept', r.stdout.slice(0, 50))
      let got = ''
      for (let off = 0; ;) {
        const o = await call(stdio, 'read_command_output', { command_id: r.command_id, offset: off, limit: 50000 })
        equal(o.running, false, 'running')
        got += o.data
        if (o.next_offset === off) break
        off = o.next_offset
      }
      equal(got.length, want.length, 'bytes read on')
      assert(got === want, 'read_command_output gives the output as written')
    },
  },
  {
    name: 'stdio: write_file, read_file and list_files',
    needs: ['stdio: create_sandbox and run_command'],
    fn: async () => {
      await call(stdio, 'write_file', { sandbox_id: sbx, path: '/home/user/work/notes.txt', content: 'line one\nünïcode\n' })
      const bin = Buffer.from([0, 1, 2, 0xff, 0xfe, 0x80])
      await call(stdio, 'write_file', { sandbox_id: sbx, path: '/home/user/work/blob.bin', content: bin.toString('base64'), encoding: 'base64' })
      const t = await call(stdio, 'read_file', { sandbox_id: sbx, path: '/home/user/work/notes.txt' })
      equal(t.content, 'line one\nünïcode\n', 'text content')
      equal(t.encoding, 'text', 'text encoding')
      const b = await call(stdio, 'read_file', { sandbox_id: sbx, path: '/home/user/work/blob.bin' })
      equal(b.encoding, 'base64', 'binary encoding')
      equal(Buffer.from(b.content, 'base64').toString('hex'), bin.toString('hex'), 'binary content')
      const l = await call(stdio, 'list_files', { sandbox_id: sbx, path: '/home/user/work' })
      const names = l.entries.map((e) => e.path).sort()
      equal(JSON.stringify(names), JSON.stringify(['/home/user/work/blob.bin', '/home/user/work/notes.txt']), 'listing')
      const seen = await call(stdio, 'run_command', { sandbox_id: sbx, command: 'md5sum < /home/user/work/blob.bin | cut -c1-32' })
      equal(seen.stdout.trim(), createHash('md5').update(bin).digest('hex'), 'the bytes the guest sees')
    },
  },
  {
    name: 'stdio: bad IDs, paths and arguments are tool errors',
    needs: ['stdio: create_sandbox and run_command'],
    fn: async (log) => {
      const checks = [
        ['run_command', { sandbox_id: 'sbxnosuchsandbox', command: 'true' }, 'not_found'],
        ['run_command', { sandbox_id: '../../etc', command: 'true' }, 'not_found'],
        ['run_command', { sandbox_id: sbx }, 'command'],
        ['run_command', { sandbox_id: sbx, command: 42 }, 'command'],
        ['read_file', { sandbox_id: sbx, path: '/etc/\u0000shadow' }, 'NUL'],
        ['read_file', { sandbox_id: sbx, path: '/no/such/file' }, 'not_found'],
        ['write_file', { sandbox_id: sbx, path: '/tmp/x', content: 'x'.repeat(8 * 1024 * 1024 + 1) }, 'more than write_file takes'],
        ['list_files', { sandbox_id: sbx }, 'path'],
        ['expose_port', { sandbox_id: sbx, port: 0 }, 'port'],
        ['fork_sandbox', { sandbox_id: sbx, count: 1000 }, 'count'],
        ['delete_sandbox', {}, 'sandbox_id'],
      ]
      for (const [tool, args, want] of checks) {
        const msg = await callError(stdio, tool, args)
        assert(msg.includes(want), `${tool} error names ${want}`, msg)
        log(`${tool}: ${msg.slice(0, 120)}`)
      }
      // The server is still there after all of them.
      const ok = await call(stdio, 'run_command', { sandbox_id: sbx, command: 'echo still' })
      equal(ok.stdout, 'still\n', 'after the bad calls')
    },
  },
  {
    name: 'stdio: expose_port gives a URL that reaches the port',
    needs: ['stdio: create_sandbox and run_command'],
    fn: async () => {
      await call(stdio, 'write_file', { sandbox_id: sbx, path: '/home/user/site/index.html', content: 'served from the sandbox\n' })
      await call(stdio, 'run_command', { sandbox_id: sbx, command: 'cd /home/user/site && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)' })
      const p = await call(stdio, 'expose_port', { sandbox_id: sbx, port: 8000 })
      assert(p.url.startsWith(url), 'the URL is under the server\'s', p.url)
      const body = await until(async () => {
        const r = await fetch(`${p.url}index.html`, { headers: { Authorization: `Bearer ${key}` } })
        return r.status === 200 ? r.text() : null
      }, 30000, 500)
      equal(body, 'served from the sandbox\n', 'what the URL serves')
      const anon = await fetch(`${p.url}index.html`)
      equal(anon.status, 401, 'the URL without the key')
    },
  },
  {
    name: 'stdio: checkpoint_sandbox and fork_sandbox',
    needs: ['stdio: write_file, read_file and list_files'],
    timeoutMs: 240000,
    fn: async (log) => {
      const chk = await call(stdio, 'checkpoint_sandbox', { sandbox_id: sbx, name: 'mcp' })
      equal(chk.state, 'ready', 'checkpoint state')
      const f = await call(stdio, 'fork_sandbox', { sandbox_id: sbx, count: 1 })
      equal(f.sandbox_ids.length, 1, 'children')
      child = f.sandbox_ids[0]
      log(`checkpoint ${chk.checkpoint_id}, fork ${f.checkpoint_id}, child ${child}`)
      const r = await call(stdio, 'run_command', { sandbox_id: child, command: 'cat /home/user/work/notes.txt; hostname' })
      assert(r.stdout.startsWith('line one\nünïcode\n'), 'the child has the parent\'s files', r.stdout)
      await call(stdio, 'delete_sandbox', { sandbox_id: child })
    },
  },
  {
    name: 'http: /v1/mcp needs a key',
    fn: async () => {
      let err
      try {
        await connect(httpTransport(''))
      } catch (e) {
        err = e
      }
      assert(err && /401|unauthenticated/.test(String(err)), 'connect without a key fails with 401 unauthenticated', String(err))
    },
  },
  {
    name: 'http: the same tools at /v1/mcp, with the key\'s tenancy',
    needs: ['stdio: create_sandbox and run_command'],
    fn: async () => {
      http = await connect(httpTransport(key))
      const { tools } = await http.listTools()
      for (const t of allTools) assert(tools.some((x) => x.name === t), `no tool ${t} over HTTP`)
      const l = await call(http, 'list_sandboxes', {})
      assert(l.sandboxes.some((s) => s.sandbox_id === sbx), 'the stdio client\'s sandbox is listed for the same key', l)
      const r = await call(http, 'run_command', { sandbox_id: sbx, command: 'cat /home/user/work/notes.txt' })
      equal(r.stdout, 'line one\nünïcode\n', 'a file written over stdio, read over HTTP')
      other = await connect(httpTransport(otherKey))
      const lo = await call(other, 'list_sandboxes', {})
      assert(!lo.sandboxes.some((s) => s.sandbox_id === sbx), 'another key does not list it', lo)
      const msg = await callError(other, 'run_command', { sandbox_id: sbx, command: 'true' })
      assert(msg.includes('not_found'), 'another key is told it does not exist', msg)
      const p = await call(http, 'expose_port', { sandbox_id: sbx, port: 8000 })
      assert(p.url.startsWith(url), 'the URL is under the server\'s as the request addressed it', p.url)
    },
  },
  {
    name: 'http: run_code keeps state and reports errors',
    needs: ['http: the same tools at /v1/mcp, with the key\'s tenancy'],
    timeoutMs: 240000,
    fn: async (log) => {
      if (!process.env.E2E_CODE_INTERPRETER) throw new Skip('the code-interpreter template is not installed')
      const sb = await call(http, 'create_sandbox', { template: 'code-interpreter', timeout_s: 600 })
      ci = sb.sandbox_id
      log(`sandbox ${ci}`)
      await call(http, 'run_code', { sandbox_id: ci, code: 'x = 6\nprint("set")' })
      const r = await call(http, 'run_code', { sandbox_id: ci, code: 'x * 7' })
      equal(r.results.find((x) => x.is_main_result)?.text, '42', 'the value of x * 7 in the same context')
      const e = await call(http, 'run_code', { sandbox_id: ci, code: '1 / 0' })
      equal(e.error?.name, 'ZeroDivisionError', 'the error\'s name')
      assert(e.error.traceback.includes('ZeroDivisionError'), 'a traceback', e.error)
      const bad = await callError(http, 'run_code', { sandbox_id: ci, code: '1', language: 'cobol' })
      assert(/cobol/.test(bad) && /python/.test(bad), 'an unknown language is refused naming the ones there are', bad)
      const none = await callError(http, 'run_code', { sandbox_id: sbx, code: '1' })
      assert(none.includes('code-interpreter'), 'a sandbox without the interpreter says so', none)
      await call(http, 'delete_sandbox', { sandbox_id: ci })
      ci = undefined
    },
  },
  {
    name: 'stdio: delete_sandbox and a clean exit',
    needs: ['stdio: create_sandbox and run_command'],
    fn: async () => {
      await call(stdio, 'delete_sandbox', { sandbox_id: sbx })
      const l = await call(stdio, 'list_sandboxes', {})
      assert(!l.sandboxes.some((s) => s.sandbox_id === sbx && s.state !== 'deleted'), 'the sandbox is gone', l)
      const msg = await callError(stdio, 'run_command', { sandbox_id: sbx, command: 'true' })
      assert(/not_found|deleted|failed_precondition/.test(msg), 'a deleted sandbox\'s command fails', msg)
      sbx = undefined
      const proc = stdioTransport._process
      const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })))
      await stdio.close()
      const { code, signal } = await exited
      assert(code === 0 || signal === 'SIGTERM', 'airlock mcp exits when its stdin closes', { code, signal, stderr: stderrLines.join('') })
      stdio = undefined
    },
  },
]

await run(cases, () => ({}))
for (const c of [http, other]) await c?.close()
if (stdio) await stdio.close()
