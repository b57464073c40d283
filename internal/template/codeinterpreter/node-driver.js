// airlock's JavaScript and TypeScript driver of the code interpreter.
//
// server.py starts one per code context, in the context's working
// directory: node node-driver.js LANGUAGE REQUESTS EVENTS, LANGUAGE
// javascript or typescript. It reads requests from file descriptor
// REQUESTS and writes events to EVENTS, one JSON object a line each way:
//
//   request  {"code": str, "env": {str: str}}
//   events   {"type": "stdout"|"stderr", "text": str}
//            {"type": "result", "data": {MIME type: value}}
//            {"type": "error", "name": str, "value": str, "traceback": str}
//            {"type": "done"}                  last of every request
//
// Requests run one after another in this process's global scope, so what
// a cell declares is there for the next. The value of a cell's last
// expression is its result; a cell that awaits at its top level runs in
// an async function, its declarations hoisted to the global scope first.
// console output and process.stdout and process.stderr writes become
// stdout and stderr events as they happen. TypeScript cells are checked
// against the context's earlier cells with Debian's node-typescript
// (type errors are TSError errors) and then run as JavaScript.

'use strict'

const fs = require('fs')
const path = require('path')
const readline = require('readline')
const util = require('util')
const vm = require('vm')
const { createRequire } = require('module')

const REQUESTS = Number(process.argv[3])
const EVENTS = Number(process.argv[4])
const language = process.argv[2] === 'typescript' ? 'typescript' : 'javascript'
const cellName = language === 'typescript' ? 'cell.ts' : 'cell.js'

function send(event) {
  const buf = Buffer.from(JSON.stringify(event) + '\n')
  for (let off = 0; off < buf.length;) {
    off += fs.writeSync(EVENTS, buf, off)
  }
}

// Output of the cells, whether through console or the streams, is sent
// as events; a child process that inherits fd 1 and 2 writes to the
// pipes server.py reads instead.
for (const [name, stream] of [['stdout', process.stdout], ['stderr', process.stderr]]) {
  stream.write = function (chunk, encoding, cb) {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8')
    send({ type: name, text })
    const done = typeof encoding === 'function' ? encoding : cb
    if (typeof done === 'function') process.nextTick(done)
    return true
  }
}

// What a cell that fails after it returned (a timer, a promise nobody
// awaits) throws goes to stderr, and the context lives on.
process.on('uncaughtException', (err) => process.stderr.write('Uncaught ' + describe(err) + '\n'))
process.on('unhandledRejection', (err) => process.stderr.write('Unhandled rejection: ' + describe(err) + '\n'))

// Cells see require as a module in the working directory would.
globalThis.require = createRequire(path.join(process.cwd(), cellName))

function describe(err) {
  return err && err.stack ? String(err.stack) : util.inspect(err)
}

// errorEvent is E2B's error shape for a thrown value, its stack without
// this driver's and node's own frames.
function errorEvent(err) {
  if (err instanceof Error || (err && typeof err === 'object' && 'message' in err && 'name' in err)) {
    const stack = String(err.stack || '').split('\n')
      .filter((l) => !l.includes(__filename) && !/\(node:|at node:/.test(l))
      .join('\n')
    return { type: 'error', name: String(err.name), value: String(err.message), traceback: stack }
  }
  return { type: 'error', name: 'Error', value: 'Uncaught ' + util.inspect(err), traceback: '' }
}

// mimeBundle is a value as the MIME types it is shown in: text/plain as
// util.inspect prints it, and application/json for plain objects and
// arrays that JSON can carry.
function mimeBundle(value) {
  const data = { 'text/plain': util.inspect(value, { depth: 4, maxArrayLength: 200 }) }
  if (value !== null && typeof value === 'object') {
    const proto = Object.getPrototypeOf(value)
    if (Array.isArray(value) || proto === Object.prototype || proto === null) {
      try {
        const json = JSON.stringify(value)
        if (json !== undefined && json.length <= 1 << 20) data['application/json'] = JSON.parse(json)
      } catch {
        // Cycles and BigInts stay text only.
      }
    }
  }
  return data
}

let ts

function typescript() {
  if (ts) return ts
  for (const name of ['typescript', '/usr/share/nodejs/typescript']) {
    try {
      ts = require(name)
      return ts
    } catch {
      // Try the next place.
    }
  }
  throw new Error("the typescript module is not installed (Debian's node-typescript)")
}

// topLevelAwait reports whether a statement awaits outside any function.
function topLevelAwait(node) {
  const t = typescript()
  if (t.isFunctionLike(node) || t.isClassStaticBlockDeclaration?.(node)) return false
  if (t.isAwaitExpression(node)) return true
  if (t.isForOfStatement(node) && node.awaitModifier) return true
  return t.forEachChild(node, topLevelAwait) === true
}

// bindingNames lists the names a declaration's binding (a name or a
// destructuring pattern) declares.
function bindingNames(name, out) {
  const t = typescript()
  if (t.isIdentifier(name)) {
    out.push(name.text)
  } else {
    for (const el of name.elements) {
      if (!t.isOmittedExpression(el)) bindingNames(el.name, out)
    }
  }
  return out
}

// asyncWrap makes a cell that awaits at its top level into a script that
// declares the cell's names globally and then runs the cell in an async
// function, which returns {value} of its last expression.
function asyncWrap(js, sf) {
  const t = typescript()
  const text = (n) => js.slice(n.getStart(sf), n.getEnd())
  const lets = []
  const vars = []
  const outer = []
  const body = []
  sf.statements.forEach((stmt, i) => {
    const last = i === sf.statements.length - 1
    if (last && t.isExpressionStatement(stmt)) {
      body.push(`return { value: (${text(stmt.expression)}\n) };`)
    } else if (t.isVariableStatement(stmt)) {
      const isVar = (stmt.declarationList.flags & (t.NodeFlags.Let | t.NodeFlags.Const)) === 0
      for (const decl of stmt.declarationList.declarations) {
        (isVar ? vars : lets).push(...bindingNames(decl.name, []))
        if (decl.initializer) body.push(`void (${text(decl.name)} = ${text(decl.initializer)}\n);`)
      }
    } else if (t.isFunctionDeclaration(stmt) && stmt.name) {
      outer.push(text(stmt))
    } else if (t.isClassDeclaration(stmt) && stmt.name) {
      lets.push(stmt.name.text)
      body.push(`${stmt.name.text} = ${text(stmt)};`)
    } else {
      body.push(text(stmt))
    }
  })
  const decls = (vars.length ? `var ${vars.join(', ')};` : '') + (lets.length ? `let ${lets.join(', ')};` : '')
  return `${decls}${outer.join('\n')}\n(async () => {\n${body.join('\n')}\n})()`
}

// Cells load modules with require: import() needs vm flags node 18
// keeps experimental.
const runOptions = { filename: cellName }

// evaluate runs JavaScript in the global scope and returns the value of
// its last expression.
async function evaluate(js) {
  if (!js.includes('await')) return vm.runInThisContext(js, runOptions)
  const t = typescript()
  const sf = t.createSourceFile(cellName, js, t.ScriptTarget.Latest, true, t.ScriptKind.JS)
  if (!sf.statements.some(topLevelAwait)) return vm.runInThisContext(js, runOptions)
  const out = await vm.runInThisContext(asyncWrap(js, sf), runOptions)
  return out ? out.value : undefined
}

// The TypeScript checker: a language service over one file that holds
// the context's earlier cells that passed the check and then the new
// cell, so that a cell sees what earlier ones declared. Node's own
// globals are declared loosely (any); a module without type declarations
// is any too.
const checkedFile = '/airlock/' + cellName
const globalsFile = '/airlock/node-globals.d.ts'
const nodeGlobals = [
  'process', 'require', 'module', 'exports', 'Buffer', 'global', '__dirname', '__filename', 'console',
  'setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'setImmediate', 'clearImmediate',
  'queueMicrotask', 'structuredClone', 'fetch', 'URL', 'URLSearchParams', 'TextEncoder', 'TextDecoder',
  'AbortController', 'AbortSignal', 'Blob', 'performance', 'atob', 'btoa',
].map((n) => `declare var ${n}: any;`).join('\n')
const ignoredCodes = new Set([2307, 7016]) // module not found; module without types
let history = ''
let checked = { text: '', version: 0 }
let service

function checker() {
  if (service) return service
  const t = typescript()
  const options = {
    target: t.ScriptTarget.ES2022, module: t.ModuleKind.ESNext, moduleResolution: t.ModuleResolutionKind.NodeJs,
    lib: ['lib.es2022.d.ts'], strict: false, noEmit: true, skipLibCheck: true, types: [],
  }
  const libDir = path.dirname(t.getDefaultLibFilePath(options))
  service = t.createLanguageService({
    getCompilationSettings: () => options,
    getScriptFileNames: () => [globalsFile, checkedFile],
    getScriptVersion: (f) => (f === checkedFile ? String(checked.version) : '1'),
    getScriptSnapshot: (f) => {
      if (f === checkedFile) return t.ScriptSnapshot.fromString(checked.text)
      if (f === globalsFile) return t.ScriptSnapshot.fromString(nodeGlobals)
      return fs.existsSync(f) ? t.ScriptSnapshot.fromString(fs.readFileSync(f, 'utf8')) : undefined
    },
    getCurrentDirectory: () => '/airlock',
    getDefaultLibFileName: (o) => t.getDefaultLibFilePath(o),
    fileExists: (f) => f === checkedFile || f === globalsFile || fs.existsSync(f),
    readFile: (f) => (fs.existsSync(f) ? fs.readFileSync(f, 'utf8') : undefined),
    readDirectory: t.sys.readDirectory,
    directoryExists: (d) => d === '/airlock' || d.startsWith(libDir) || fs.existsSync(d),
    getDirectories: t.sys.getDirectories,
  }, t.createDocumentRegistry())
  return service
}

// declares reports whether a top-level statement declares a name.
function declares(st) {
  const t = typescript()
  return t.isVariableStatement(st) || t.isFunctionDeclaration(st) || t.isClassDeclaration(st) ||
    t.isInterfaceDeclaration(st) || t.isTypeAliasDeclaration(st) || t.isEnumDeclaration(st) ||
    t.isModuleDeclaration(st) || t.isImportDeclaration(st) || t.isImportEqualsDeclaration(st)
}

// compileTypeScript type-checks a cell and returns it as JavaScript, or
// throws a TSError naming every type error in the cell.
function compileTypeScript(code) {
  const t = typescript()
  const start = history.length
  checked = { text: history + code + '\nexport {};\n', version: checked.version + 1 }
  const svc = checker()
  const diags = [...svc.getSyntacticDiagnostics(checkedFile), ...svc.getSemanticDiagnostics(checkedFile)]
    .filter((d) => d.category === t.DiagnosticCategory.Error && !ignoredCodes.has(d.code))
    .filter((d) => d.start === undefined || (d.start >= start && d.start <= start + code.length))
  if (diags.length > 0) {
    const lines = diags.map((d) => {
      const msg = t.flattenDiagnosticMessageText(d.messageText, '\n')
      if (d.start === undefined) return `error TS${d.code}: ${msg}`
      const before = code.slice(0, d.start - start).split('\n')
      return `${cellName}(${before.length},${before[before.length - 1].length + 1}): error TS${d.code}: ${msg}`
    })
    const err = new Error(`TS${diags[0].code}: ${t.flattenDiagnosticMessageText(diags[0].messageText, '\n')}`)
    err.name = 'TSError'
    err.stack = lines.join('\n')
    throw err
  }
  // Only a cell that declares something matters to the cells after it.
  const sf = svc.getProgram().getSourceFile(checkedFile)
  if (sf.statements.some((st) => st.getStart(sf) >= start && declares(st))) history += code + '\n;\n'
  let js = t.transpileModule(code, {
    compilerOptions: { target: t.ScriptTarget.ES2022, module: t.ModuleKind.CommonJS, esModuleInterop: true },
  }).outputText
  // A cell with an import is a module to TypeScript, whose CommonJS form
  // starts with a directive and an export marker that a script does not
  // need (and whose directive would be the value of a cell of
  // declarations).
  js = js.replace(/^"use strict";\n/, '')
    .replace(/^Object\.defineProperty\(exports, "__esModule", \{ value: true \}\);\n/m, '')
  return js
}

async function run(req) {
  const env = req.env && typeof req.env === 'object' ? req.env : {}
  const saved = {}
  for (const [k, v] of Object.entries(env)) {
    saved[k] = process.env[k]
    process.env[k] = String(v)
  }
  try {
    const code = String(req.code ?? '')
    const js = language === 'typescript' ? compileTypeScript(code) : code
    const value = await evaluate(js)
    if (value !== undefined) send({ type: 'result', data: mimeBundle(value) })
  } catch (err) {
    send(errorEvent(err))
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
    send({ type: 'done' })
  }
}

// Requests run in order, each after the one before has ended.
let queue = Promise.resolve()
const lines = readline.createInterface({ input: fs.createReadStream(null, { fd: REQUESTS }), crlfDelay: Infinity })
lines.on('line', (line) => {
  let req
  try {
    req = JSON.parse(line)
  } catch (err) {
    send({ type: 'error', name: 'ProtocolError', value: 'request is not JSON: ' + err.message, traceback: '' })
    send({ type: 'done' })
    return
  }
  queue = queue.then(() => run(req))
})
lines.on('close', () => process.exit(0))
