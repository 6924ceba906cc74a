// The E2B control plane through the E2B SDK: create, info, list with
// filters and pages, timeouts, kill, pause and connect, metrics, errors.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget } from '../budget.mjs'
import { sdk, Sandbox, withSandbox, api, sleep, get } from './helpers.mjs'

const run = Math.random().toString(36).slice(2)
console.log(`e2b control tests: run ${run}, sdk ${process.env.E2B_SDK}`)


// SLEEPER_ALIVE prints alive while the `sleep 600` whose pid is in
// /home/user/pid runs, else ended (a boot may give its pid to another
// process).
const SLEEPER_ALIVE = `[ "$(tr '\\0' ' ' 2>/dev/null < /proc/$(cat /home/user/pid)/cmdline)" = "sleep 600 " ] && echo alive || echo ended`

test('create, getInfo and kill', async () => {
  const sbx = await Sandbox.create({ metadata: { run, kind: 'info' }, timeoutMs: 60_000 })
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { run, kind: 'info' })
  assert.equal(info.envdVersion, '0.6.4')
  assert.equal(info.cpuCount, 2)
  assert.ok(info.memoryMB > 0)
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left > 50_000 && left <= 60_000, `endAt ${info.endAt} is not about 60 s away`)
  assert.equal(await sbx.kill(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), sdk.SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(sbx.sandboxId), sdk.SandboxNotFoundError)
})

test('setTimeout moves the deadline', async () => {
  await withSandbox(async (sbx) => {
    await sbx.setTimeout(600_000)
    const info = await sbx.getInfo()
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 590_000 && left <= 600_000, `endAt ${info.endAt}`)
    await assert.rejects(Sandbox.setTimeout('nosuchsandbox', 10_000), sdk.SandboxNotFoundError)
  })
})

test('list filters by metadata and state and pages with X-Next-Token', async () => {
  const tag = `${run}-list`
  const sbxs = await Promise.all([1, 2, 3].map((i) => Sandbox.create({ metadata: { tag, i: String(i) }, timeoutMs: 120_000 })))
  try {
    const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 2 })
    const first = await pager.nextItems()
    assert.equal(first.length, 2)
    assert.equal(pager.hasNext, true)
    const second = await pager.nextItems()
    assert.equal(second.length, 1)
    assert.equal(pager.hasNext, false)
    const ids = [...first, ...second].map((s) => s.sandboxId).sort()
    assert.deepEqual(ids, sbxs.map((s) => s.sandboxId).sort())
    // Newest first.
    assert.ok(first[0].startedAt >= first[1].startedAt && first[1].startedAt >= second[0].startedAt)
    const one = await Sandbox.list({ query: { metadata: { tag, i: '2' } } }).nextItems()
    assert.deepEqual(one.map((s) => s.sandboxId), [sbxs[1].sandboxId])
    assert.equal(one[0].state, 'running')
    const paused = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems()
    assert.deepEqual(paused, [])
  } finally {
    await Promise.all(sbxs.map((s) => s.kill()))
  }
})

test('pause, pause again, isRunning, connect resumes', async () => {
  await withSandbox(async (sbx) => {
    assert.equal(await sbx.isRunning(), true)
    // A command pools a connection to envd before the pause.
    assert.equal((await sbx.commands.run('echo before')).stdout, 'before\n')
    assert.equal(await sbx.pause(), true)
    assert.equal(await Sandbox.pause(sbx.sandboxId), false)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const listed = await Sandbox.list({ query: { metadata: { run, kind: 'pause' }, state: ['paused'] } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
    // envd traffic to a paused sandbox is a 502: not running, not resumed.
    assert.equal(await sbx.isRunning(), false)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 90_000 })
    assert.equal(again.sandboxId, sbx.sandboxId)
    // The first command right after the resume runs: the restored
    // sandbox resets connections of its life before the pause, and none
    // of those may carry it (it failed with "Sandbox is probably not
    // running anymore").
    assert.equal((await again.commands.run('echo after')).stdout, 'after\n')
    assert.equal((await sbx.getInfo()).state, 'running')
    assert.equal(await again.isRunning(), true)
    // Connecting to a running sandbox answers it as it is.
    await Sandbox.connect(sbx.sandboxId)
  }, { metadata: { run, kind: 'pause' } })
})

test('lifecycle.autoResume: traffic to the paused sandbox resumes it, memory and all', async () => {
  const sbx = await Sandbox.create({ lifecycle: { onTimeout: 'pause', autoResume: true }, metadata: { run, kind: 'autoresume' }, timeoutMs: 120_000 })
  try {
    assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
    // A value only the shell's memory holds, and a file.
    await sbx.commands.run('echo kept > /tmp/f; sleep 600 & echo $! > /tmp/pid')
    assert.equal(await sbx.pause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    // Three commands at once: one resume serves them all.
    const outs = await Promise.all([0, 1, 2].map(() => sbx.commands.run('cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive')))
    for (const out of outs) assert.equal(out.stdout, 'kept\nalive\n')
    assert.equal((await sbx.getInfo()).state, 'running')
    // autoResume needs a pause at the timeout, as E2B says.
    const res = await api('POST', '/sandboxes', { templateID: 'base', autoResume: { enabled: true } })
    assert.equal(res.status, 400, res.text)
    assert.match(res.text, /autoResume/)
  } finally {
    await sbx.kill()
  }
})

test('pause({ keepMemory: false }): files kept, processes ended, connect boots it with the same credentials', async () => {
  const sbx = await Sandbox.create({ secure: true, lifecycle: { onTimeout: 'pause', autoResume: true }, metadata: { run, kind: 'filespause' }, timeoutMs: 120_000 })
  try {
    await sbx.commands.run('echo kept > /home/user/f; sleep 600 >/dev/null 2>&1 & echo $! > /home/user/pid')
    await sbx.commands.run('rm /etc/motd', { user: 'root' })
    const boot = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    assert.equal(await sbx.pause({ keepMemory: false }), true)
    assert.equal(await sbx.pause({ keepMemory: false }), false, 'a second pause: already paused')
    assert.equal((await sbx.getInfo()).state, 'paused')
    // Traffic does not wake a files-only pause, even with autoResume: envd answers as for any paused sandbox.
    const envd = await get(sbx.getHost(49983), {}, '/health')
    assert.equal(envd.status, 502, `envd of a files-only paused sandbox: ${envd.body}`)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const again = await sbx.connect()
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal(await again.isRunning(), true)
    // After a boot pids start over: "alive" is the pid still running sleep 600, not any process of that pid.
    const out = await again.commands.run(`cat /home/user/f; ls /etc/motd 2>&1 || true; ${SLEEPER_ALIVE}`)
    assert.match(out.stdout, /^kept\n.*No such file.*\nended\n$/s)
    assert.notEqual((await again.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout, boot, 'a fresh boot')
    assert.equal(await again.files.read('/home/user/f'), 'kept\n')
  } finally {
    await sbx.kill()
  }
})

test('onTimeout { action: pause, keepMemory: false } pauses files only; connect({ onResume: reboot }) boots a memory pause', async () => {
  const sbx = await Sandbox.create({ lifecycle: { onTimeout: { action: 'pause', keepMemory: false } }, metadata: { run, kind: 'filesautopause' }, timeoutMs: budget(120_000) })
  try {
    await sbx.files.write('/home/user/marker', 'files')
    const boot = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    // The deadline comes once the files are there, however slow the machine.
    await sbx.setTimeout(2_000)
    for (const end = Date.now() + budget(30_000); (await sbx.getInfo()).state !== 'paused';) {
      assert.ok(Date.now() < end, 'the deadline did not pause it')
      await sleep(200)
    }
    await sbx.connect({ timeoutMs: 120_000 })
    assert.equal(await sbx.files.read('/home/user/marker'), 'files')
    const booted = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    assert.notEqual(booted, boot)
    // A memory pause, then a resume asked to reboot: the files, not the processes.
    await sbx.commands.run('sleep 600 >/dev/null 2>&1 & echo $! > /home/user/pid')
    assert.equal(await sbx.pause(), true)
    await sbx.connect({ onResume: 'reboot', timeoutMs: 120_000 })
    const out = await sbx.commands.run(`cat /home/user/marker; echo; ${SLEEPER_ALIVE}`)
    assert.equal(out.stdout, 'files\nended\n')
    assert.notEqual((await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout, booted)
  } finally {
    await sbx.kill()
  }
  // As E2B: a files-only auto-pause cannot wake by traffic.
  const res = await api('POST', '/v2/sandboxes', { templateID: 'base', autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } })
  assert.equal(res.status, 400, res.text)
  assert.match(res.text, /autoPauseMemory/)
})

test('getMetrics returns usage samples', async () => {
  await withSandbox(async (sbx) => {
    let metrics = []
    for (const end = Date.now() + budget(10_000); metrics.length === 0 && Date.now() < end;) {
      metrics = await sbx.getMetrics()
      if (metrics.length === 0) await sleep(200)
    }
    assert.ok(metrics.length > 0, 'no metrics sample')
    const m = metrics.at(-1)
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp))
    assert.equal(m.cpuCount, 2)
    assert.ok(m.memTotal > 0 && m.memUsed > 0)
    await assert.rejects(Sandbox.getMetrics('nosuchsandbox'), sdk.SandboxNotFoundError)
  })
})

test('a wrong API key is an authentication error', async () => {
  await assert.rejects(Sandbox.create({ apiKey: 'lz_not_a_key' }), sdk.AuthenticationError)
})

test('bad input is a 4xx in E2B error shape, never a 500', async () => {
  const cases = [
    ['POST', '/v2/sandboxes', { templateID: 'base', timeout: -1 }, 400],
    ['POST', '/v2/sandboxes', { templateID: 'base', timeout: 'x' }, 400],
    ['POST', '/v2/sandboxes', '{not json', 400],
    ['POST', '/sandboxes', { templateID: 'no-such-template' }, 404],
    ['POST', '/v2/sandboxes', { templateID: 'base', envVars: { 'A=B': 'x' } }, 400],
    ['POST', '/v2/sandboxes', { templateID: 'base', volumeMounts: [{ name: 'v', path: '/v' }] }, 400],
    ['GET', '/v2/sandboxes?state=sleeping', undefined, 400],
    ['GET', '/v2/sandboxes?limit=0', undefined, 400],
    ['GET', '/v2/sandboxes?nextToken=%%%', undefined, 400],
    ['GET', '/v2/sandboxes?metadata=%zz', undefined, 400],
    ['GET', '/sandboxes/nosuch', undefined, 404],
    ['DELETE', '/sandboxes/nosuch', undefined, 404],
    ['POST', '/sandboxes/nosuch/timeout', { timeout: 10 }, 404],
    ['POST', '/sandboxes/nosuch/timeout', {}, 400],
    ['POST', '/sandboxes/nosuch/pause', undefined, 404],
    ['POST', '/v2/sandboxes/nosuch/connect', { timeout: 10 }, 404],
    ['GET', '/sandboxes/nosuch/metrics?start=abc', undefined, 400],
    ['GET', '/sandboxes/nosuch/no/such/route', undefined, 400],
    ['POST', '/v3/templates', {}, 400],
    ['POST', '/v2/sandboxes', { timeout: 30 }, 400],
    ['POST', '/v2/sandboxes', { templateID: 'base', metadata: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v'])) }, 400],
  ]
  for (const [method, path, body, want] of cases) {
    const res = await api(method, path, body)
    assert.equal(res.status, want, `${method} ${path}: ${res.text}`)
    assert.equal(res.json?.code, want, `${method} ${path}: ${res.text}`)
    assert.equal(typeof res.json?.message, 'string')
  }
  const unauth = await api('GET', '/v2/sandboxes', undefined, '')
  assert.equal(unauth.status, 401)
  assert.equal(unauth.json.code, 401)
})

test('templates list the built ones with E2B names', async () => {
  const res = await api('GET', '/templates')
  assert.equal(res.status, 200)
  const base = res.json.find((t) => t.templateID === 'base')
  assert.ok(base, res.text)
  assert.equal(base.buildStatus, 'ready')
  assert.equal(base.envdVersion, '0.6.4')
  // code-interpreter-v1 is listed whenever its base, interpreter, is built.
  const interp = res.json.find((t) => t.templateID === 'interpreter')
  const ci = res.json.find((t) => t.templateID === 'code-interpreter-v1')
  assert.equal(Boolean(ci), Boolean(interp), res.text)
  if (ci) assert.ok(ci.names.includes('code-interpreter-v1'))
})

test('onTimeout pause (autoPause) pauses at the deadline; connect resumes', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' }, metadata: { run, kind: 'autopause' } })
  try {
    assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause')
    let state = 'running'
    for (const end = Date.now() + budget(20_000); Date.now() < end && state !== 'paused';) {
      await sleep(200)
      state = (await sbx.getInfo()).state
    }
    assert.equal(state, 'paused')
    await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    const info = await sbx.getInfo()
    assert.equal(info.state, 'running')
    assert.ok(info.endAt.getTime() - Date.now() > 30_000, `endAt ${info.endAt}`)
  } finally {
    await sbx.kill()
  }
})

test('a sandbox killed under a running command ends its wait at once, saying so', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  const cmd = await sbx.commands.run('sleep 60', { background: true })
  await sbx.kill()
  const began = Date.now()
  const err = await cmd.wait().catch((e) => e)
  // The proxy's connection to envd goes with the sandbox: the stream ends,
  // the SDK's health check finds the sandbox gone and says why.
  assert.ok(err instanceof sdk.TimeoutError, `${err?.constructor?.name}: ${err?.message}`)
  assert.match(err.message, /sandbox was killed or reached its end of life/)
  assert.ok(Date.now() - began < budget(20_000), `wait took ${Date.now() - began} ms`)
})

test("base is E2B's base: git, sudo without a password for user, python", async () => {
  await withSandbox(async (sbx) => {
    // sudo needs set-user-ID programs honoured (runsc --allow-suid).
    const r = await sbx.commands.run('whoami; sudo -n whoami; git --version; python --version')
    const [me, root, git, python] = r.stdout.trim().split('\n')
    assert.equal(me, 'user')
    assert.equal(root, 'root')
    assert.match(git, /^git version /)
    assert.match(python, /^Python 3\./)
  })
})
