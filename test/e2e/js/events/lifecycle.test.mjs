// A sandbox's life through the official SDK, for TestEvents
// (events_test.go), which follows it on GET /api/events and its webhooks:
// created, paused, resumed and killed. The sandbox's id goes to the file
// EVENTS_OUT names.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFileSync } from 'node:fs'
import { budget, lizard } from '../helpers.mjs'

test('a sandbox created, paused, resumed and killed', async () => {
  const sb = await lizard.create('base', { timeoutMs: budget(120_000) })
  writeFileSync(process.env.EVENTS_OUT, sb.sandboxId)
  try {
    assert.equal(await sb.pause(), true)
    await sb.waitForStatus('paused')
    assert.equal(await sb.resume(), true)
    await sb.waitForStatus('running')
    assert.equal((await sb.process.exec('echo ok')).stdout, 'ok\n')
  } finally {
    await sb.kill()
  }
})
