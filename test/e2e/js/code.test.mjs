// The built-in templates beyond base: the SDK's CodeSandbox on the
// interpreter template, the python312 and node22 aliases, and the template
// listing. They need every built-in template built (make templates).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { CodeSandbox } from '@lizard-build/sdk'
import { budget, lizard } from './helpers.mjs'

const apiUrl = process.env.LIZARD_API_URL
const apiKey = process.env.LIZARD_API_KEY

async function getTemplates(key = apiKey) {
  const res = await fetch(`${apiUrl}/api/templates`, { headers: key ? { 'X-API-Key': key } : {} })
  return { status: res.status, body: await res.json() }
}

// template returns the listing's entry of name, failing clearly when the
// template is not built: these tests need it, they do not skip.
async function template(name) {
  const { status, body } = await getTemplates()
  assert.equal(status, 200, JSON.stringify(body))
  const t = body.find((e) => e.name === name)
  assert.ok(t, `GET /api/templates has no template ${name}: ${JSON.stringify(body)}`)
  assert.equal(t.status, 'ready', `template ${name} is not built (status ${t.status}): run make templates or bin/lizard template build ${name}`)
  return t
}

test('GET /api/templates lists the built-in templates with their versions', async () => {
  const { status, body } = await getTemplates()
  assert.equal(status, 200)
  // claude and codex (the prompt schedules' agents) are listed built or
  // not: make templates leaves them out unless TEMPLATES names them.
  assert.deepEqual(body.map((t) => t.name), ['base', 'claude', 'code-interpreter-v1', 'codex', 'desktop', 'interpreter', 'node', 'python'])
  const by = Object.fromEntries(body.map((t) => [t.name, t]))
  // E2B's code-interpreter template: the interpreter's files with the
  // code-interpreter server as its start command.
  assert.equal(by['code-interpreter-v1'].status, 'ready')
  assert.ok(by['code-interpreter-v1'].version.startsWith(by.interpreter.version + '+'), by['code-interpreter-v1'].version)
  assert.deepEqual(by.python.aliases, ['python312'])
  assert.deepEqual(by.node.aliases, ['node22'])
  assert.deepEqual(by.interpreter.aliases, [])
  for (const name of ['python', 'node', 'interpreter']) {
    const t = by[name]
    assert.equal(t.status, 'ready', `template ${name} is not built: make templates`)
    assert.match(t.version, /^bookworm-\d{8}T\d{6}Z$/)
    assert.ok(t.sizeBytes > 50 << 20, `${name} sizeBytes ${t.sizeBytes}`)
    assert.ok(Date.parse(t.builtAt) <= Date.now(), `${name} builtAt ${t.builtAt}`)
    assert.match(t.versions.debian, /^12\./)
    assert.match(t.versions.python, /^3\.\d+\.\d+$/)
  }
  assert.match(by.node.versions.node, /^\d+\.\d+\.\d+$/)
  assert.match(by.interpreter.versions.node, /^\d+\.\d+\.\d+$/)
  for (const lib of ['numpy', 'pandas', 'matplotlib', 'ipykernel']) {
    assert.match(by.interpreter.versions[lib] ?? '', /^\d+\.\d+/, `interpreter ${lib} version`)
  }
  assert.equal((await getTemplates('')).status, 401)
  assert.equal((await getTemplates('lz_not_a_key')).status, 401)
})

test('python312 and node22 boot the python and node templates', async () => {
  const py = await template('python')
  const sb = await lizard.create('python312', { timeoutMs: 120_000 })
  try {
    assert.equal((await sb.getInfo()).template, 'python312')
    const v = await sb.process.exec('python3 --version')
    assert.equal(v.stdout.trim(), `Python ${py.versions.python}`)
    const pip = await sb.process.exec('python3 -m pip --version && python3 -m venv /tmp/venv && /tmp/venv/bin/python -c "import sys; print(sys.prefix)"', { user: 'user' })
    assert.equal(pip.exitCode, 0, pip.stderr)
    assert.match(pip.stdout, /^pip \d+/)
    assert.match(pip.stdout, /\/tmp\/venv\n$/)
  } finally {
    await sb.kill()
  }

  const node = await template('node')
  const nb = await lizard.create('node22', { timeoutMs: 120_000 })
  try {
    const v = await nb.process.exec('node --version; npm --version', { user: 'user' })
    assert.equal(v.exitCode, 0, v.stderr)
    const [nodeVersion, npmVersion] = v.stdout.trim().split('\n')
    assert.equal(nodeVersion, `v${node.versions.node}`)
    assert.equal(npmVersion, node.versions.npm)
    const js = await nb.process.exec(['node', '-e', 'console.log([1, 2, 3].map((n) => n * 2).join(","))'])
    assert.equal(js.stdout, '2,4,6\n')
  } finally {
    await nb.kill()
  }
})

// The CodeSandbox tests share one interpreter sandbox: booting one per test
// would only repeat the kernel start.
let sbx
before(async () => {
  await template('interpreter')
  sbx = await CodeSandbox.create({ project: 'default', timeoutMs: 300_000 })
})
after(async () => {
  await sbx?.kill()
})

test('runCode keeps state in the kernel and returns the last value', async () => {
  assert.equal((await sbx.getInfo()).template, 'interpreter')
  const set = await sbx.runCode('x = 21')
  assert.equal(set.error, undefined)
  assert.deepEqual(set.results, [])
  const run = await sbx.runCode('x * 2')
  assert.equal(run.error, undefined, run.error?.traceback)
  assert.deepEqual(run.results, [{ type: 'result', mime: 'text/plain', data: '42' }])
  assert.ok(run.executionCount > set.executionCount, `executionCount ${set.executionCount} then ${run.executionCount}`)
  const out = await sbx.runCode('import sys\nprint("out"); print("err", file=sys.stderr)')
  assert.equal(out.stdout, 'out\n')
  assert.equal(out.stderr, 'err\n')
  assert.equal(out.success, true)
})

test('a matplotlib figure comes back as image/png', async () => {
  const run = await sbx.runCode([
    'import matplotlib.pyplot as plt',
    'import numpy as np, pandas as pd',
    'df = pd.DataFrame({"x": np.arange(10), "y": np.arange(10) ** 2})',
    'plt.plot(df.x, df.y)',
    'plt.title("squares")',
    'plt.show()',
  ].join('\n'))
  assert.equal(run.error, undefined, run.error?.traceback)
  const png = run.results.find((r) => r.mime === 'image/png')
  assert.ok(png, `no image/png result: ${JSON.stringify(run.results.map((r) => r.mime))}`)
  const bytes = Buffer.from(png.data, 'base64')
  assert.equal(bytes.subarray(1, 4).toString(), 'PNG')
  assert.ok(bytes.length > 1000, `png of ${bytes.length} bytes`)
  // Outside the kernel (a plain script) matplotlib draws headless with Agg.
  const script = await sbx.process.exec(['python3', '-c', 'import matplotlib, matplotlib.pyplot as plt; plt.plot([1, 2]); plt.savefig("/tmp/p.png"); print(matplotlib.get_backend())'], { user: 'user' })
  assert.equal(script.exitCode, 0, script.stderr)
  assert.equal(script.stdout.trim().toLowerCase(), 'agg')
})

test('an exception is execution.error with its name and traceback', async () => {
  const run = await sbx.runCode('def f():\n    return 1 / 0\nf()')
  assert.equal(run.success, false)
  assert.equal(run.error.name, 'ZeroDivisionError')
  assert.match(run.error.message, /division by zero/)
  assert.match(run.error.traceback, /ZeroDivisionError/)
  assert.match(run.error.traceback, /return 1 \/ 0/)
  // The kernel lives on.
  const after = await sbx.runCode('x + 1')
  assert.equal(after.results[0]?.data, '22')
})

test('contexts: create, list, restart and delete', async () => {
  const ctx = await sbx.createContext({ language: 'python', cwd: '/tmp/ctx-work' })
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/tmp/ctx-work')
  assert.match(ctx.id, /^ctx-/)
  await sbx.runCode('y = 5', { context: ctx })
  const inCtx = await sbx.runCode('import os\nprint(y, os.getcwd())', { context: ctx })
  assert.equal(inCtx.stdout, '5 /tmp/ctx-work\n')
  // The default context is another kernel.
  const other = await sbx.runCode('y')
  assert.equal(other.error?.name, 'NameError')

  const bashCtx = await sbx.createContext({ language: 'bash' })
  const listed = await sbx.listContexts()
  assert.deepEqual(listed.map((c) => c.id).sort(), [ctx.id, bashCtx.id].sort())
  assert.deepEqual(listed.find((c) => c.id === ctx.id), ctx)

  await sbx.restartContext(ctx)
  const restarted = await sbx.runCode('y', { context: ctx })
  assert.equal(restarted.error?.name, 'NameError')

  await sbx.deleteContext(ctx)
  await sbx.deleteContext(bashCtx.id)
  assert.deepEqual(await sbx.listContexts(), [])
})

test('bash and javascript run as processes', async () => {
  const sh = await sbx.runCode('echo $((6 * 7)); whoami', { language: 'bash' })
  assert.equal(sh.error, undefined, sh.error?.traceback)
  assert.equal(sh.stdout, '42\nroot\n')
  const js = await sbx.runCode('console.log(6 * 7, typeof process.version)', { language: 'javascript' })
  assert.equal(js.error, undefined, js.error?.traceback)
  assert.equal(js.stdout, '42 string\n')
  const jsErr = await sbx.runCode('throw new Error("boom")', { language: 'javascript' })
  assert.equal(jsErr.error?.name, 'ExitError')
  assert.match(jsErr.error.traceback, /boom/)
  const shErr = await sbx.runCode('exit 3', { language: 'bash' })
  assert.equal(shErr.error?.name, 'ExitError')
  assert.match(shErr.error.message, /code 3/)
})

test('a timeout interrupts the cell and keeps the kernel state', async () => {
  await sbx.runCode('z = 7')
  const started = Date.now()
  const slow = await sbx.runCode('import time\nwhile True:\n    time.sleep(0.1)', { timeoutMs: 3_000 })
  assert.equal(slow.error?.name, 'TimeoutError')
  assert.ok(Date.now() - started < budget(30_000), `timeout took ${Date.now() - started} ms`)
  const kept = await sbx.runCode('z * 6')
  assert.equal(kept.error, undefined, kept.error?.traceback)
  assert.equal(kept.results[0]?.data, '42')
})

test('the user account can use /tmp and its home', async () => {
  const r = await sbx.process.exec('mkdir -p /tmp/.lizard-code-user/a && touch /home/user/f && stat -c %a /tmp && id -u', { user: 'user' })
  assert.equal(r.exitCode, 0, r.stderr)
  assert.equal(r.stdout, '1777\n1000\n')
})
