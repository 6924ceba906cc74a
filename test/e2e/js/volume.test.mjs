// Persistent volumes with the official SDK: create/getOrCreate/get/list,
// resize, delete, a sandbox seeing one at /workspace, data outliving the
// sandbox, the hard size limit and the one-holder rule.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { ConflictError, NotFoundError } from '@lizard-build/sdk'
import { lizard } from './helpers.mjs'

test('volumes: lifecycle, /workspace, ENOSPC, 409s, resize', async () => {
  const name = `e2e-vol-${Date.now().toString(36)}`
  const vol = await lizard.volumes.create(name, { sizeGb: 1 })
  assert.ok(vol.volumeId)
  const again = await lizard.volumes.getOrCreate(name, { sizeGb: 3 })
  assert.equal(again.volumeId, vol.volumeId, 'getOrCreate returns the existing volume')
  await assert.rejects(lizard.volumes.create(name), ConflictError)
  await assert.rejects(lizard.volumes.create('Bad_Name'), (e) => e.status === 400)
  await assert.rejects(lizard.volumes.create(`${name}-x`, { sizeGb: 51 }), (e) => e.status === 400 && e.code === 'invalid_volume_size')
  const listed = await lizard.volumes.list()
  assert.ok(listed.some((v) => v.id === vol.volumeId && v.name === name && v.sizeGb === 1 && v.attachedTo === null))
  const projectId = await lizard.projectId()

  const a = await lizard.create('base', { volumeName: name, timeoutMs: 120_000 })
  try {
    const info = await vol.getInfo(projectId)
    assert.equal(info.attachedTo, a.sandboxId)
    await assert.rejects(lizard.create('base', { volumeId: vol.volumeId }), (e) => e instanceof ConflictError && e.message.includes(a.sandboxId))
    await assert.rejects(lizard.volumes.delete(name), ConflictError)
    await assert.rejects(a.fork({ count: 1 }), ConflictError)
    await a.fs.write('/workspace/notes.txt', 'kept across sandboxes')
    const asUser = await a.process.exec('echo mine > /workspace/user.txt && stat -c %U /workspace/user.txt', { user: 'user' })
    assert.equal(asUser.stdout, 'user\n', 'the default user can write')
  } finally {
    await a.kill()
  }
  assert.equal((await vol.getInfo(projectId)).attachedTo, null, 'kill detaches')

  const b = await lizard.create('base', { volumeId: vol.volumeId, timeoutMs: 120_000 })
  try {
    assert.equal(await b.fs.read('/workspace/notes.txt'), 'kept across sandboxes')
    const full = await b.process.exec('dd if=/dev/zero of=/workspace/big bs=1M count=1100 2>&1; sync')
    assert.match(full.stdout, /No space left on device/)
    const grown = await lizard.volumes.resize(name, 2)
    assert.equal(grown.sizeGb, 2)
    const df = await b.process.exec("df -BM --output=avail /workspace | tail -1 | tr -d ' M'")
    assert.ok(Number(df.stdout) > 900, `the sandbox sees the new room at once: ${df.stdout} MiB free`)
    assert.equal((await b.process.exec('dd if=/dev/zero of=/workspace/more bs=1M count=100 2>&1')).exitCode, 0)
  } finally {
    await b.kill()
  }
  await assert.rejects(lizard.volumes.resize(name, 1), (e) => e instanceof ConflictError && e.code === 'volume_too_full_to_shrink')
  await lizard.volumes.delete(name)
  await assert.rejects(lizard.volumes.get(name), NotFoundError)
})
