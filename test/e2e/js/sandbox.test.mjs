import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Lizard, Sandbox, NotFoundError, LizardError } from '@lizard-build/sdk'
import { lizard, withSandbox, sleep } from './helpers.mjs'
import { budget } from './budget.mjs'

test('info, list, metadata, connect and hostname', async () => {
  await withSandbox(async (sb) => {
    const info = await sb.getInfo()
    assert.equal(info.sandboxId, sb.sandboxId)
    assert.equal(info.template, 'base')
    assert.equal(info.status, 'running')
    assert.equal(info.size, 'small')
    assert.equal(info.cpus, 2)
    assert.equal(info.memoryMb, 4096)
    assert.deepEqual(info.metadata, { owner: 'e2e' })
    assert.equal(info.pauseError, null)
    assert.ok(Date.parse(info.startedAt) <= Date.now())
    assert.ok(Date.parse(info.endAt) > Date.now())
    const all = await lizard.list()
    assert.ok(all.some((s) => s.sandboxId === sb.sandboxId))
    const connected = await Sandbox.connect(sb.sandboxId)
    const host = await connected.process.exec('hostname')
    assert.equal(host.stdout.trim(), sb.sandboxId)
    const cpus = await sb.process.exec('nproc')
    assert.equal(cpus.stdout.trim(), '2')
  }, { size: 'small', metadata: { owner: 'e2e' } })
})

test('unknown template is a not-found error', async () => {
  await assert.rejects(lizard.create('no-such-template'), NotFoundError)
})

test('unknown size is refused', async () => {
  await assert.rejects(lizard.create('base', { size: 'enormous' }), (e) => e instanceof LizardError && e.status === 400)
})

test('create-time envs reach every command, per-command envs win', async () => {
  await withSandbox(async (sb) => {
    const a = await sb.process.exec('echo $GREETING $OTHER')
    assert.equal(a.stdout, 'hello world\n')
    const b = await sb.process.exec('echo $GREETING', { envs: { GREETING: 'bye' } })
    assert.equal(b.stdout, 'bye\n')
  }, { envs: { GREETING: 'hello', OTHER: 'world' } })
})

test('deadline kills the sandbox; setTimeout moves it', async () => {
  // The first deadline follows the machine: on a slow one the second
  // create alone can take longer than 2 s, and kept must still be alive
  // when its deadline is moved.
  const first = budget(2_000)
  const short = await lizard.create('base', { timeoutMs: first })
  const kept = await lizard.create('base', { timeoutMs: first })
  try {
    await kept.setTimeout(60_000 + 2 * first)
    await sleep(2 * first)
    await assert.rejects(short.getInfo(), NotFoundError)
    const info = await kept.getInfo()
    assert.equal(info.status, 'running')
    assert.equal((await kept.process.exec('echo alive')).stdout, 'alive\n')
    await assert.rejects(kept.setTimeout(10), (e) => e.status === 400)
  } finally {
    await short.kill()
    await kept.kill()
  }
})

test('timeoutMs 0 means no deadline', async () => {
  await withSandbox(async (sb) => {
    const info = await sb.getInfo()
    assert.equal(info.endAt, null)
  }, { timeoutMs: 0 })
})
