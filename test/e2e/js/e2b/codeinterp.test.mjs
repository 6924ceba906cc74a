// @e2b/code-interpreter, unchanged, against lizard: its Sandbox boots the
// code-interpreter-v1 template and runs code on port 49999 (lizard's
// code-interpreter server on Jupyter kernels) through the preview proxy.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { api, proxyUrl } from './helpers.mjs'

test('runCode keeps state, streams output, returns results, charts and errors; contexts', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    const info = await sbx.getInfo()
    assert.equal(info.templateId, 'code-interpreter-v1')

    // State across calls, the main result's text, the execution count.
    await sbx.runCode('x = 41')
    const stdout = []
    const stderr = []
    const exec = await sbx.runCode("import sys\nprint('out')\nprint('err', file=sys.stderr)\nx + 1", {
      onStdout: (m) => stdout.push(m.line),
      onStderr: (m) => stderr.push(m.line),
    })
    assert.equal(exec.error, undefined)
    assert.equal(exec.text, '42')
    assert.deepEqual(exec.logs.stdout, ['out\n'])
    assert.deepEqual(exec.logs.stderr, ['err\n'])
    assert.deepEqual(stdout, ['out\n'])
    assert.deepEqual(stderr, ['err\n'])
    assert.ok(exec.executionCount >= 2, `executionCount ${exec.executionCount}`)

    // A matplotlib chart is a PNG result beside its text.
    const chart = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
    const png = chart.results.find((r) => r.png)
    assert.ok(png, JSON.stringify(chart.toJSON()))
    assert.ok(png.formats().includes('png'))
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
    // ... and its chart, as the SDK reads Result.chart.
    assert.equal(png.chart.type, 'line', JSON.stringify(png.chart))
    assert.deepEqual(png.chart.elements[0].points, [[1, 1], [2, 4], [3, 9]])
    assert.equal(png.chart.x_scale, 'linear')
    const bars = await sbx.runCode("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nplt.title('bars')\nplt.show()")
    const bar = bars.results.find((r) => r.chart)
    assert.equal(bar.chart.type, 'bar')
    assert.equal(bar.chart.title, 'bars')
    assert.deepEqual(bar.chart.elements.map((e) => [e.label, e.value]), [['a', 3], ['b', 5]])

    // Rich results: HTML and data of a DataFrame.
    const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
    assert.ok(df.results[0].html.includes('<table'), df.results[0].html)
    assert.deepEqual(df.results[0].data.columns, ['a'])

    // An error: name, value, traceback; the kernel lives on.
    const err = await sbx.runCode('1 / 0')
    assert.equal(err.error.name, 'ZeroDivisionError')
    assert.equal(err.error.value, 'division by zero')
    assert.match(err.error.traceback, /ZeroDivisionError/)
    assert.equal((await sbx.runCode('x')).text, '41')

    // Environment variables for one call.
    const envs = await sbx.runCode("import os; os.environ.get('CI_VAR', 'unset')", { envs: { CI_VAR: 'set' } })
    assert.equal(envs.text, "'set'")
    assert.equal((await sbx.runCode("import os; os.environ.get('CI_VAR', 'unset')")).text, "'unset'")

    // Contexts: own state and cwd, listed, restarted, removed.
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, "'/tmp'")
    assert.equal((await sbx.runCode('x', { context: ctx })).error.name, 'NameError')
    await sbx.runCode('y = 1', { context: ctx })
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('y', { context: ctx })).error.name, 'NameError')
    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await assert.rejects(sbx.runCode('1', { context: ctx }), (e) => e.name === 'NotFoundError')

    // A language the template has no kernel for is refused, not a 500.
    await assert.rejects(sbx.runCode('1', { language: 'r' }), /400/)
  } finally {
    await sbx.kill()
  }
})

test('JavaScript and bash contexts; the sandbox\'s envs reach every context', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, envs: { SBX_VAR: 'from-create' } })
  try {
    assert.equal((await sbx.runCode("import os; os.environ.get('SBX_VAR')")).text, "'from-create'")

    // JavaScript (node): state across calls, output, the last value, envs.
    const js = await sbx.runCode('let a = 40; console.log("hi"); a + 2', { language: 'js' })
    assert.equal(js.error, undefined)
    assert.equal(js.text, '42')
    assert.equal(js.logs.stdout.join(''), 'hi\n')
    const jsEnv = await sbx.runCode('a + process.env.SBX_VAR + process.env.CALL', { language: 'javascript', envs: { CALL: '!' } })
    assert.equal(jsEnv.text, "'40from-create!'")
    assert.equal((await sbx.runCode('process.env.CALL', { language: 'javascript' })).text, undefined)
    const jsErr = await sbx.runCode('throw new TypeError("boom")', { language: 'javascript' })
    assert.equal(jsErr.error.name, 'TypeError')
    assert.equal(jsErr.error.value, 'boom')
    assert.equal((await sbx.runCode('const r = await Promise.resolve(7)\nr * 2', { language: 'js' })).text, '14')

    // bash: variables and cwd persist; envs for a call; a failing status.
    const sh = await sbx.runCode('echo $SBX_VAR $CALL; echo err >&2; X=5; cd /tmp', { language: 'bash', envs: { CALL: 'c' } })
    assert.equal(sh.error, undefined)
    assert.equal(sh.logs.stdout.join(''), 'from-create c\n')
    assert.equal(sh.logs.stderr.join(''), 'err\n')
    const sh2 = await sbx.runCode('echo $X $(pwd) ${CALL-unset}; false', { language: 'bash' })
    assert.equal(sh2.logs.stdout.join(''), '5 /tmp unset\n')
    assert.equal(sh2.error.name, 'ExitError')
    assert.equal(sh2.error.value, 'exit status 1')

    const ctx = await sbx.createCodeContext({ language: 'bash', cwd: '/tmp' })
    assert.equal(ctx.language, 'bash')
    assert.equal((await sbx.runCode('pwd; echo ${X-unset}', { context: ctx })).logs.stdout.join(''), '/tmp\nunset\n')

    // TypeScript is not run (node has no TypeScript here): a clear 400.
    await assert.rejects(sbx.runCode('1', { language: 'typescript' }), /400/)
  } finally {
    await sbx.kill()
  }
})

test('a secure sandbox: /execute needs its envd access token, /contexts does not', async () => {
  // Made through the API: the SDK of 2.51 no longer sends secure.
  const res = await api('POST', '/sandboxes', { templateID: 'code-interpreter-v1', secure: true, timeout: 120 })
  assert.equal(res.status, 201, res.text)
  const { sandboxID, envdAccessToken } = res.json
  assert.match(envdAccessToken ?? '', /^[0-9a-f]{64}$/)
  try {
    const execute = (headers) => fetch(`${proxyUrl.origin}/execute`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sandboxID, 'E2b-Sandbox-Port': '49999', ...headers },
      body: JSON.stringify({ code: '6 * 7' }),
    })
    assert.equal((await execute({})).status, 401)
    assert.equal((await execute({ 'X-Access-Token': 'wrong' })).status, 401)
    const ok = await execute({ 'X-Access-Token': envdAccessToken })
    const body = await ok.text()
    assert.equal(ok.status, 200, body)
    assert.match(body, /"text": "42"/)
    const ctxs = await fetch(`${proxyUrl.origin}/contexts`, { headers: { 'E2b-Sandbox-Id': sandboxID, 'E2b-Sandbox-Port': '49999' } })
    assert.equal(ctxs.status, 200)
  } finally {
    await api('DELETE', `/sandboxes/${sandboxID}`)
  }
})
