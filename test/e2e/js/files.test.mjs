import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { NotFoundError } from '@lizard-build/sdk'
import { withSandbox } from './helpers.mjs'

test('files: write, read, bytes, list, stat, move, remove', async () => {
  await withSandbox(async (sb) => {
    await sb.fs.write('/work/deep/dir/a.txt', 'héllo\n')
    assert.equal(await sb.fs.read('/work/deep/dir/a.txt'), 'héllo\n')
    const bin = randomBytes(300_000)
    await sb.fs.write('/work/blob.bin', bin)
    const back = await sb.fs.readBytes('/work/blob.bin')
    assert.ok(Buffer.from(back).equals(bin), 'binary round trip is exact')

    const list = await sb.fs.list('/work')
    const names = list.map((e) => e.name).sort()
    assert.deepEqual(names, ['blob.bin', 'deep'])
    const blob = list.find((e) => e.name === 'blob.bin')
    assert.deepEqual(Object.keys(blob).sort(), ['name', 'path', 'size', 'type'])
    assert.equal(blob.type, 'file')
    assert.equal(blob.size, 300_000)
    assert.equal(blob.path, '/work/blob.bin')

    const st = await sb.fs.stat('/work/deep/dir/a.txt')
    assert.equal(st.type, 'file')
    assert.equal(st.size, Buffer.byteLength('héllo\n'))
    assert.equal(st.permissions, '-rw-r--r--')
    assert.equal(st.owner, 'root')
    assert.equal(typeof st.mode, 'number')
    assert.ok(Math.abs(st.modTime - Date.now()) < 120_000)
    assert.equal(typeof st.modifiedAt, 'number', 'modifiedAt is unix milliseconds, as the SDK types it')
    assert.equal(st.modifiedAt, st.modTime)
    assert.equal((await sb.fs.stat('/work')).type, 'dir')
    await sb.process.exec('ln -s /work/blob.bin /work/link')
    const link = await sb.fs.stat('/work/link')
    assert.equal(link.type, 'symlink')
    assert.equal(link.symlinkTarget, '/work/blob.bin')

    await sb.fs.move('/work/deep/dir/a.txt', '/elsewhere/new/b.txt')
    assert.equal(await sb.fs.read('/elsewhere/new/b.txt'), 'héllo\n')
    await assert.rejects(sb.fs.read('/work/deep/dir/a.txt'), NotFoundError)
    await sb.fs.remove('/work/deep')
    await assert.rejects(sb.fs.stat('/work/deep'), NotFoundError)
    await sb.fs.makeDir('/made/by/mkdir')
    assert.equal((await sb.fs.stat('/made/by/mkdir')).type, 'dir')
  })
})

test('files: as a user, and permission errors', async () => {
  await withSandbox(async (sb) => {
    await sb.fs.write('/home/user/notes.txt', 'mine', { user: 'user' })
    const st = await sb.fs.stat('/home/user/notes.txt')
    assert.equal(st.owner, 'user')
    assert.equal(st.group, 'user')
    await assert.rejects(sb.fs.write('/root/forbidden.txt', 'x', { user: 'user' }), (e) => e.status === 403)
    await assert.rejects(sb.fs.read('/no/such/file'), NotFoundError)
  })
})
