// Pause/resume, snapshot/restore and fork with the official SDK: memory and
// running processes are kept — an in-memory counter keeps its pid and goes
// on counting.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError } from '@lizard-build/sdk'
import { budget, lizard, withSandbox, sleep } from './helpers.mjs'

// The counter lives only in a process's memory; it prints its pid and value
// to a file every 50 ms. COUNTER starts it and waits for its first count.
const COUNTER = `cat > /tmp/counter.py <<'PY'
import os, time
n = 0
while True:
    n += 1
    with open('/tmp/counter.tmp', 'w') as f:
        f.write(f"{os.getpid()} {n}")
    os.replace('/tmp/counter.tmp', '/tmp/counter')
    time.sleep(0.05)
PY
nohup python3 /tmp/counter.py > /dev/null 2>&1 &
# python may take a while to start on a loaded host: wait for its first count
for i in $(seq 300); do [ -f /tmp/counter ] && break; sleep 0.1; done; cat /tmp/counter`

async function counter(sb) {
  const r = await sb.process.exec('cat /tmp/counter')
  assert.equal(r.exitCode, 0, r.stderr)
  const [pid, n] = r.stdout.trim().split(' ').map(Number)
  return { pid, n }
}

async function alive(sb, pid) {
  return (await sb.process.exec(`kill -0 ${pid}`)).exitCode === 0
}

test('pause and resume keep memory, processes and files', async () => {
  await withSandbox(async (sb) => {
    await sb.process.exec(COUNTER)
    await sb.fs.write('/root/kept.txt', 'still here')
    const first = await counter(sb)
    assert.equal(await sb.pause(), true)
    const paused = await sb.waitForStatus('paused')
    assert.equal(paused.pauseError, null)
    await assert.rejects(sb.process.exec('true'), (e) => e.status === 409)
    await sleep(300)
    assert.equal(await sb.resume(), true)
    await sb.waitForStatus('running')
    const after = await counter(sb)
    assert.equal(after.pid, first.pid, 'same process')
    assert.ok(after.n >= first.n, `counter ${first.n} → ${after.n}`)
    await sleep(300)
    const later = await counter(sb)
    assert.ok(later.n > after.n, 'it keeps counting after resume')
    assert.equal(await sb.fs.read('/root/kept.txt'), 'still here')
    assert.equal(await sb.resume(), true, 'resume of a running sandbox is a no-op')
    const connected = await Sandbox.connect(sb.sandboxId)
    assert.equal((await connected.process.exec('echo ok')).stdout, 'ok\n')
  })
})

test('snapshot, restore and the warm pool', async () => {
  await withSandbox(async (sb) => {
    await sb.process.exec(COUNTER)
    await sb.fs.write('/root/from-source.txt', 'source')
    const source = await counter(sb)
    const snap = await sb.snapshot('e2e snapshot', { poolSize: 1 })
    assert.equal(snap.status, 'ready')
    assert.equal(snap.name, 'e2e snapshot')
    assert.equal(typeof snap.projectId, 'string')
    assert.equal(snap.cpus, 4)
    assert.equal(snap.memoryMb, 8192)
    assert.ok(await alive(sb, source.pid), 'the source keeps running')
    const got = await Sandbox.getSnapshot(snap.id)
    assert.equal(got.id, snap.id)
    assert.ok((await Sandbox.snapshots(got.projectId)).some((s) => s.id === snap.id))
    const ready = await Sandbox.waitForSnapshot(snap.id, { waitTimeoutMs: budget(60_000) })
    assert.equal(ready.readyCount, 1)

    const copies = []
    try {
      for (let i = 0; i < 2; i++) {
        const c = await Sandbox.restore(snap.id, { timeoutMs: 120_000 })
        copies.push(c)
        assert.notEqual(c.sandboxId, sb.sandboxId)
        assert.equal((await c.process.exec('hostname')).stdout.trim(), c.sandboxId)
        const cc = await counter(c)
        assert.equal(cc.pid, source.pid, 'the copy runs the same process')
        await sleep(200)
        assert.ok((await counter(c)).n > cc.n, 'and it counts')
        assert.equal(await c.fs.read('/root/from-source.txt'), 'source')
      }
      await copies[0].fs.write('/root/only-first.txt', 'x')
      await assert.rejects(copies[1].fs.read('/root/only-first.txt'), NotFoundError)
      await assert.rejects(sb.fs.read('/root/only-first.txt'), NotFoundError)

      await Sandbox.setSnapshotWarmPool(snap.id, 0)
      await Sandbox.pauseSnapshot(snap.id)
      await Sandbox.resumeSnapshot(snap.id)
    } finally {
      for (const c of copies) await c.kill()
      await Sandbox.deleteSnapshot(snap.id)
    }
    await assert.rejects(Sandbox.getSnapshot(snap.id), NotFoundError)
  })
})

test('fork clones a running sandbox', async () => {
  await withSandbox(async (sb) => {
    await sb.process.exec(COUNTER)
    const source = await counter(sb)
    const forks = await sb.fork({ count: 3 })
    assert.equal(forks.length, 3)
    try {
      for (const f of forks) {
        assert.ok(f.sandbox, `fork failed: ${f.error}`)
        assert.equal(f.info.sandboxId, f.sandbox.sandboxId)
        const c = await counter(f.sandbox)
        assert.equal(c.pid, source.pid)
        assert.equal((await f.sandbox.process.exec('hostname')).stdout.trim(), f.sandbox.sandboxId)
      }
      await forks[0].sandbox.fs.write('/root/mine', '0')
      await assert.rejects(forks[1].sandbox.fs.read('/root/mine'), NotFoundError)
      await assert.rejects(sb.fs.read('/root/mine'), NotFoundError)
      assert.ok(await alive(sb, source.pid), 'the source keeps running')
    } finally {
      for (const f of forks) await f.sandbox?.kill()
    }
  })
})
