// Run by TestClusterResumeAnywhere (cluster_move_test.go) through a node
// other than the one that paused the sandbox, after that node was killed and
// removed: the official SDK connects to the paused sandbox and resumes it;
// its in-memory counter goes on with the same pid, its files are kept.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@lizard-build/sdk'
import { counter, sleep } from '../helpers.mjs'

const id = process.env.MOVE_SANDBOX
const pid = Number(process.env.MOVE_PID)
const n = Number(process.env.MOVE_N)

test('a paused sandbox whose node is gone resumes on another node', async () => {
  assert.ok(id && pid > 0 && n > 0, 'MOVE_SANDBOX, MOVE_PID and MOVE_N are set')
  const sb = await Sandbox.connect(id)
  assert.equal(await sb.resume(), true)
  await sb.waitForStatus('running')
  const first = await counter(sb)
  assert.equal(first.pid, pid, 'same process')
  assert.ok(first.n >= n, `counter ${n} → ${first.n}`)
  await sleep(300)
  const later = await counter(sb)
  assert.ok(later.n > first.n, 'it keeps counting on its new node')
  assert.equal(await sb.fs.read('/root/file'), 'data\n')
})
