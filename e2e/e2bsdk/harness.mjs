// The small runner the SDK scripts share. A script declares its cases in
// order and calls run(); each case's result is one line on stdout,
//
//	E2E {"case": NAME, "ok": true|false, "skip"?: REASON, "error"?: TEXT, "ms": N, "log": [...]}
//
// preceded by a plan line (E2E {"plan": [NAMES]}) and followed by a done
// line (E2E {"done": true, ...}), which e2e/e2b_sdk_test.go turns into one
// Go subtest per case. A case that depends on one that failed is reported
// as failed too ("not run"), never as passed or skipped, so nothing is
// hidden. Other output (the SDK's own, stray logs) goes to stderr.

import http from 'node:http'
import { inspect } from 'node:util'

const marker = 'E2E '

function emit(obj) {
  process.stdout.write(marker + JSON.stringify(obj) + '\n')
}

// Skip marks a case as not applicable here (a missing test host, say);
// the Go side reports it with t.Skip and the reason.
export class Skip extends Error {}

// NotRun is a case that depends on one that did not pass.
class NotRun extends Error {}

// fail throws an assertion error with what was seen.
export function fail(msg, seen) {
  throw new Error(seen === undefined ? msg : `${msg}; got ${inspect(seen, { depth: 6, breakLength: Infinity })}`)
}

export function assert(cond, msg, seen) {
  if (!cond) fail(msg, seen)
}

export function equal(got, want, what) {
  if (got !== want) fail(`${what}: want ${inspect(want)}`, got)
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// until polls f (an async function returning a truthy value when done)
// every stepMs until timeoutMs, and returns its last value.
export async function until(f, timeoutMs, stepMs = 250) {
  const end = Date.now() + timeoutMs
  let v
  for (;;) {
    v = await f()
    if (v || Date.now() > end) return v
    await sleep(stepMs)
  }
}

// rejects runs f and returns what it threw; it fails if f did not throw.
export async function rejects(f, what) {
  try {
    const v = await f()
    fail(`${what}: did not throw`, v)
  } catch (e) {
    if (e instanceof Error && e.message.startsWith(`${what}: did not throw`)) throw e
    return e
  }
}

// run executes cases in order. A case is {name, fn(log), needs?: [names],
// timeoutMs?}; fn may throw Skip. It returns how many cases failed
// (skipped ones are not failures). With E2E_PLAN_ONLY set it only prints the
// plan (the Go side lists cases it will not run, with the reason). With
// E2E_CASES set (a regular expression) only the cases whose names match
// are planned and run, with the cases they need.
export async function run(cases, extra = () => ({})) {
  if (process.env.E2E_CASES) {
    const re = new RegExp(process.env.E2E_CASES)
    const want = new Set(cases.filter((c) => re.test(c.name)).map((c) => c.name))
    for (let grew = true; grew; ) {
      grew = false
      for (const c of cases) {
        if (!want.has(c.name)) continue
        for (const n of c.needs || []) {
          if (!want.has(n)) grew = want.add(n)
        }
      }
    }
    cases = cases.filter((c) => want.has(c.name))
  }
  emit({ plan: cases.map((c) => c.name) })
  if (process.env.E2E_PLAN_ONLY) return 0
  const passed = new Set()
  let failed = 0
  for (const c of cases) {
    const start = Date.now()
    const logs = []
    const log = (...a) => logs.push(a.map((x) => (typeof x === 'string' ? x : inspect(x, { depth: 6, breakLength: Infinity }))).join(' '))
    const rec = { case: c.name }
    try {
      const missing = (c.needs || []).filter((n) => !passed.has(n))
      if (missing.length) throw new NotRun(`not run: it needs ${missing.join(', ')}, which did not pass`)
      const limit = c.timeoutMs || 60_000
      let timer
      await Promise.race([
        c.fn(log),
        new Promise((_, rej) => {
          timer = setTimeout(() => rej(new Error(`case timed out after ${limit} ms`)), limit)
        }),
      ]).finally(() => clearTimeout(timer))
      rec.ok = true
      passed.add(c.name)
    } catch (e) {
      if (e instanceof Skip) {
        rec.ok = true
        rec.skip = e.message
      } else {
        rec.ok = false
        rec.error = e instanceof NotRun ? e.message : e instanceof Error ? inspect(e) : `thrown: ${inspect(e)}`
        failed++
      }
    }
    rec.ms = Date.now() - start
    rec.log = logs
    emit(rec)
  }
  emit({ done: true, failed, ...extra() })
  return failed
}

// recorder is an HTTP proxy in front of the control plane that remembers
// every request's method, path and answer, so cases can check which E2B
// routes the SDK used (v2 create and connect) and what they answered. It
// forwards bodies and headers untouched, chunked or not.
export async function recorder(upstream) {
  const up = new URL(upstream)
  const seen = []
  const agent = new http.Agent({ keepAlive: true })
  const srv = http.createServer((req, res) => {
    const entry = { method: req.method, path: req.url, status: 0 }
    seen.push(entry)
    const preq = http.request(
      { host: up.hostname, port: up.port, method: req.method, path: req.url, headers: req.headers, agent },
      (pres) => {
        entry.status = pres.statusCode
        res.writeHead(pres.statusCode, pres.rawHeaders)
        pres.pipe(res)
      },
    )
    preq.on('error', (err) => {
      entry.status = 599
      entry.error = String(err)
      res.writeHead(502, { 'content-type': 'text/plain' })
      res.end(`recorder: ${err}`)
    })
    req.pipe(preq)
  })
  await new Promise((r) => srv.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${srv.address().port}`,
    seen,
    // since returns the entries recorded after mark (a previous length).
    since: (mark) => seen.slice(mark),
    close: () => {
      srv.close()
      srv.closeAllConnections()
      agent.destroy()
    },
  }
}

// httpGet sends GET path to base (scheme://host:port) with the given Host
// header, as a client of a sandbox port would through E2B's router.
export function httpGet(base, host, path, timeoutMs = 10_000) {
  const u = new URL(base)
  return new Promise((resolve, reject) => {
    const req = http.request(
      { hostname: u.hostname, port: u.port, path, method: 'GET', headers: { Host: host }, timeout: timeoutMs, agent: false },
      (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (d) => (body += d))
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }))
        res.on('error', reject)
      },
    )
    req.on('timeout', () => req.destroy(new Error(`GET ${path} with Host ${host}: no answer in ${timeoutMs} ms`)))
    req.on('error', reject)
    req.end()
  })
}
