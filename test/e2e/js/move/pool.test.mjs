// Run by TestClusterPoolMoves (cluster_pool_test.go) through a node that
// does not keep the snapshot's warm pool, after the pool moved off the
// snapshot's node: the official SDK sees the refilled pool, restores a
// copy (a warm one, claimed on the pool's node), whose in-memory counter
// goes on from the snapshot's value, then sets the pool to 0, which
// releases the copies. The restored sandbox's id goes to POOL_OUT.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFile } from 'node:fs/promises'
import { Sandbox } from '@lizard-build/sdk'
import { budget, counter, sleep } from '../helpers.mjs'

const snapId = process.env.POOL_SNAPSHOT
const pid = Number(process.env.POOL_PID)
const n = Number(process.env.POOL_N)

async function waitReady(want) {
  const deadline = Date.now() + budget(180_000)
  for (;;) {
    const snap = await Sandbox.getSnapshot(snapId)
    if (snap.readyCount === want) return snap
    assert.ok(Date.now() < deadline, `readyCount ${snap.readyCount} (pool ${snap.poolSize}), want ${want}`)
    await sleep(250)
  }
}

test('a warm pool rebuilt on another node serves restores and lets go', async () => {
  assert.ok(snapId && pid > 0 && n > 0 && process.env.POOL_OUT, 'POOL_SNAPSHOT, POOL_PID, POOL_N and POOL_OUT are set')
  const before = await waitReady(2)
  assert.equal(before.poolSize, 2)
  const sb = await Sandbox.restore(snapId, { timeoutMs: 300_000 })
  await writeFile(process.env.POOL_OUT, sb.sandboxId)
  const first = await counter(sb)
  assert.equal(first.pid, pid, 'the snapshot\'s process')
  assert.ok(first.n >= n, `counter from the snapshot's ${n}: ${first.n}`)
  await sleep(300)
  const later = await counter(sb)
  assert.ok(later.n > first.n, 'it keeps counting')

  const set = await Sandbox.setSnapshotWarmPool(snapId, 0)
  assert.equal(set.poolSize, 0)
  const after = await waitReady(0)
  assert.equal(after.poolSize, 0)
})
