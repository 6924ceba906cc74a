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
    assert.equal(envs.text, 'set')
    assert.equal((await sbx.runCode("import os; os.environ.get('CI_VAR', 'unset')")).text, 'unset')

    // Contexts: own state and cwd, listed, restarted, removed.
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    assert.equal((await sbx.runCode('x', { context: ctx })).error.name, 'NameError')
    await sbx.runCode('y = 1', { context: ctx })
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('y', { context: ctx })).error.name, 'NameError')
    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await assert.rejects(sbx.runCode('1', { context: ctx }), (e) => e.name === 'NotFoundError')

    // A language the template has no kernel for is refused, not a 500.
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), /400/)
  } finally {
    await sbx.kill()
  }
})

test('JavaScript and bash contexts; the sandbox\'s envs reach every context', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, envs: { SBX_VAR: 'from-create' } })
  try {
    assert.equal((await sbx.runCode("import os; os.environ.get('SBX_VAR')")).text, 'from-create')

    // JavaScript (node): state across calls, output, the last value, envs.
    const js = await sbx.runCode('let a = 40; console.log("hi"); a + 2', { language: 'js' })
    assert.equal(js.error, undefined)
    assert.equal(js.text, '42')
    assert.equal(js.logs.stdout.join(''), 'hi\n')
    const jsEnv = await sbx.runCode('a + process.env.SBX_VAR + process.env.CALL', { language: 'javascript', envs: { CALL: '!' } })
    assert.equal(jsEnv.text, '40from-create!')
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

// What E2B's own suites expect of results, in our words: strings without
// their repr's quotes, a default context per language, a new context in
// the user's home with the sandbox's envs, bash's exit as an error,
// import declarations in JavaScript cells, PIL images and charts as E2B's
// server extracts them.
test('results, contexts and charts as E2B gives them', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, envs: { FROM_CREATE: 'yes' } })
  try {
    assert.equal((await sbx.runCode("'abc'")).text, 'abc')
    assert.equal((await sbx.runCode('"double"')).text, 'double')
    assert.equal((await sbx.runCode(`"it's"`)).text, "it's")

    const langs = (await sbx.listCodeContexts()).map((c) => c.language)
    for (const l of ['python', 'javascript', 'bash']) assert.ok(langs.includes(l), `default contexts ${langs}`)

    const ctx = await sbx.createCodeContext()
    assert.equal(ctx.cwd, '/home/user')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/home/user')
    assert.equal((await sbx.runCode("import os; os.getenv('FROM_CREATE')", { context: ctx })).text, 'yes')
    assert.equal((await sbx.runCode('!pwd', { context: ctx })).logs.stdout.join('').trim(), '/home/user')

    // Several Python contexts made at once all come up, each its own.
    const many = await Promise.all([1, 2, 3, 4].map(() => sbx.createCodeContext({ language: 'python' })))
    assert.equal(new Set(many.map((c) => c.id)).size, 4)
    const seen = await Promise.all(many.map((c, i) => sbx.runCode(`n = ${i}\nn * 10`, { context: c })))
    assert.deepEqual(seen.map((e) => e.text), ['0', '10', '20', '30'])

    // exit in a bash cell ends that cell with its status, not the runner.
    const exited = await sbx.runCode('echo before; exit 42', { language: 'bash' })
    assert.equal(exited.error?.name, 'ExitError', JSON.stringify(exited.toJSON()))
    assert.equal(exited.error.value, 'exit status 42')
    assert.equal(exited.logs.stdout.join(''), 'before\n')
    assert.equal((await sbx.runCode('echo after', { language: 'bash' })).logs.stdout.join(''), 'after\n')

    const esm = await sbx.runCode("import { readFileSync } from 'fs'\nimport path, { join as j } from 'path'\nconsole.log(typeof readFileSync, typeof path.join, j('a', 'b'))", { language: 'js' })
    assert.equal(esm.error, undefined, JSON.stringify(esm.toJSON()))
    assert.equal(esm.logs.stdout.join(''), 'function function a/b\n')
    assert.equal((await sbx.runCode('typeof readFileSync', { language: 'js' })).text, 'function')

    const pil = await sbx.runCode("from PIL import Image\nImage.new('RGB', (8, 8), 'red').save('/tmp/red.png')")
    assert.ok(pil.results.some((r) => r.png), JSON.stringify(pil.toJSON()))

    const chartOf = async (code) => {
      const e = await sbx.runCode(code)
      const r = e.results.find((r) => r.chart)
      assert.ok(r, JSON.stringify(e.toJSON()))
      return r.chart
    }
    const dates = await chartOf("import datetime, matplotlib.pyplot as plt\nd = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(5)]\nplt.plot(d, [1, 3, 2, 5, 4])\nplt.xlabel('Day (utc)')\nplt.show()")
    assert.equal(dates.type, 'line')
    assert.equal(dates.title, null)
    assert.equal(dates.x_scale, 'datetime')
    assert.equal(dates.x_unit, 'utc')
    assert.equal(dates.y_label, null)
    assert.equal(dates.y_unit, null)
    assert.ok(dates.x_ticks.every((t) => typeof t === 'string' && !Number.isNaN(Date.parse(t))), JSON.stringify(dates.x_ticks))
    assert.deepEqual(dates.elements[0].points[0], ['2024-01-01', 1])
    const cats = await chartOf("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], ['low', 'mid', 'high'])\nplt.show()")
    assert.equal(cats.y_scale, 'categorical')
    assert.equal(cats.x_scale, 'linear')
    const pie = await chartOf("import matplotlib.pyplot as plt\nplt.pie([3, 1], labels=['most', 'rest'], startangle=90)\nplt.title('share')\nplt.show()")
    assert.equal(pie.type, 'pie')
    assert.deepEqual(pie.elements.map((e) => [e.label, e.angle]), [['most', 270], ['rest', 90]])
    const box = await chartOf("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.boxplot([[1, 2, 3, 4, 5], [2, 4, 6, 8, 30]], patch_artist=True)\nax.set_xticks([1, 2], ['p', 'q'])\nax.set_ylabel('Time [ms]')\nplt.show()")
    assert.equal(box.type, 'box_and_whisker')
    assert.equal(box.y_unit, 'ms')
    assert.deepEqual(box.elements.map((e) => [e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers]),
      [['p', 1, 2, 3, 4, 5, []], ['q', 2, 4, 6, 8, 8, [30]]])
  } finally {
    await sbx.kill()
  }
})

// The other languages of E2B's code interpreter: R on IRkernel, Java in
// JShell, TypeScript transpiled for node. Each keeps its state, starts in
// the user's home, sees the sandbox's envs (Java as system properties) and
// a call's own for that call, and reports an error as an error.
test('R, Java and TypeScript contexts', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, envs: { SBX_VAR: 'from-create' } })
  try {
    const text = (e) => e.results[0]?.text?.trim()

    // R: a value keeps R's print form, quotes included.
    assert.equal(text(await sbx.runCode('getwd()', { language: 'r' })), '[1] "/home/user"')
    await sbx.runCode('x <- 20', { language: 'r' })
    assert.equal(text(await sbx.runCode('x * 2 + 2', { language: 'r' })), '[1] 42')
    assert.equal(text(await sbx.runCode('Sys.getenv("SBX_VAR")', { language: 'r' })), '[1] "from-create"')
    assert.equal(text(await sbx.runCode('Sys.getenv("CALL")', { language: 'r', envs: { CALL: 'it\'s "quoted"' } })), '[1] "it\'s \\"quoted\\""')
    assert.equal(text(await sbx.runCode('Sys.getenv("CALL", unset = "gone")', { language: 'r' })), '[1] "gone"')
    const rOut = await sbx.runCode('cat("hi\\n")', { language: 'r' })
    assert.equal(rOut.logs.stdout.join(''), 'hi\n')
    const rErr = await sbx.runCode('stop("boom")', { language: 'r' })
    assert.match(rErr.error?.value ?? '', /boom/, JSON.stringify(rErr.toJSON()))

    // Java: statements, declarations kept, the last expression's value.
    assert.equal(text(await sbx.runCode('System.getProperty("user.dir")', { language: 'java' })), '/home/user')
    const j = await sbx.runCode('int n = 40;\nSystem.out.println("hi " + n);\nn + 2', { language: 'java' })
    assert.equal(j.logs.stdout.join(''), 'hi 40\n')
    assert.equal(text(j), '42')
    assert.equal(text(await sbx.runCode('n * 10', { language: 'java' })), '400')
    assert.equal(text(await sbx.runCode('System.getProperty("SBX_VAR")', { language: 'java' })), 'from-create')
    assert.equal(text(await sbx.runCode('System.getProperty("CALL")', { language: 'java', envs: { CALL: 'c' } })), 'c')
    assert.equal(text(await sbx.runCode('System.getProperty("CALL", "gone")', { language: 'java' })), 'gone')
    const jErr = await sbx.runCode('Integer.parseInt("z")', { language: 'java' })
    assert.equal(jErr.error?.name, 'java.lang.NumberFormatException', JSON.stringify(jErr.toJSON()))
    const jBad = await sbx.runCode('undefinedName + 1', { language: 'java' })
    assert.equal(jBad.error?.name, 'CompilationError', JSON.stringify(jBad.toJSON()))
    assert.match(jBad.error.value, /cannot find symbol/)

    // TypeScript: types are dropped, the rest runs as JavaScript.
    const ts = await sbx.runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' })
    assert.deepEqual(ts.logs.stdout, ['Hello World!\n'])
    assert.equal((await sbx.runCode('process.cwd()', { language: 'typescript' })).text, '/home/user')
    assert.equal((await sbx.runCode('interface P { n: number }\nconst p: P = { n: 2 }\nawait Promise.resolve(p.n * 21)', { language: 'ts' })).text, '42')
    assert.equal((await sbx.runCode('process.env.SBX_VAR', { language: 'ts' })).text, 'from-create')

    const ctx = await sbx.createCodeContext({ language: 'r', cwd: '/tmp' })
    assert.equal(ctx.language, 'r')
    assert.equal(text(await sbx.runCode('getwd()', { context: ctx })), '[1] "/tmp"')
    assert.equal((await sbx.runCode('exists("x")', { context: ctx })).results[0]?.text, '[1] FALSE')
  } finally {
    await sbx.kill()
  }
})
