// The README quickstart of @lizard-build/sdk, as a user runs it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Lizard, Sandbox, NotFoundError } from '@lizard-build/sdk'

test('README quickstart', async () => {
  const lizard = new Lizard({ project: 'default' })
  const sandbox = await lizard.create('base', { timeoutMs: 300_000 })
  try {
    await sandbox.fs.write('/tmp/hello.txt', 'Hello from Lizard!')
    const result = await sandbox.process.exec('cat /tmp/hello.txt')
    assert.equal(result.exitCode, 0, result.stderr)
    assert.equal(result.stdout, 'Hello from Lizard!')
  } finally {
    assert.equal(await sandbox.kill(), true)
  }
  assert.equal(await sandbox.kill(), false, 'a second kill reports the sandbox already gone')
  await assert.rejects(Sandbox.connect(sandbox.sandboxId), NotFoundError)
})
