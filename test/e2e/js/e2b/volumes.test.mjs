// E2B's volumes through the E2B SDK: Volume.create/getInfo/connect/list/
// destroy, volumeMounts on create (one holder at a time), and the volume's
// files through its content API, on a volume no sandbox holds (changed on
// the host) and on one a sandbox holds (changed through that sandbox).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget } from '../budget.mjs'
import { sdk, Sandbox, api } from './helpers.mjs'

const { Volume } = sdk
const run = Math.random().toString(36).slice(2)
const sdkName = process.env.E2B_SDK.replace(/[^a-z0-9]/g, '')
console.log(`e2b volume tests: run ${run}, sdk ${sdkName}`)

const mount = '/workspace'

// sh runs a command in the sandbox and returns its stdout.
async function sh(sbx, cmd) {
  return (await sbx.commands.run(cmd)).stdout
}

test('a volume written through the volume API is read in a sandbox that mounts it, and the reverse; a second holder is refused', async () => {
  const name = `data-${run}-${sdkName}`
  const vol = await Volume.create(name)
  assert.equal(vol.name, name)
  assert.ok(vol.volumeId && vol.token, 'a volume id and its token')
  const sbxs = []
  try {
    // Free: written on the host.
    const stat = await vol.writeFile('/hello.txt', 'from the API')
    assert.equal(stat.name, 'hello.txt')
    assert.equal(stat.type, 'file')
    assert.equal(stat.path, '/hello.txt')
    assert.equal(stat.size, 12)
    assert.ok(stat.mtime instanceof Date && !isNaN(stat.mtime))
    await vol.makeDir('/dir/sub', { force: true })
    await vol.writeFile('/dir/sub/deep.txt', 'deep')
    await assert.rejects(vol.writeFile('/hello.txt', 'again'), sdk.VolumeError)
    await vol.writeFile('/hello.txt', 'from the API, twice\n', { force: true })
    await assert.rejects(vol.readFile('/nope.txt'), sdk.VolumePathNotFoundError)

    const sbx = await Sandbox.create({ volumeMounts: { [mount]: vol }, metadata: { run, kind: 'holder' }, timeoutMs: budget(180_000) })
    sbxs.push(sbx)
    assert.equal(await sbx.files.read(`${mount}/hello.txt`), 'from the API, twice\n')
    assert.equal(await sh(sbx, `cat ${mount}/dir/sub/deep.txt`), 'deep')
    // What the API wrote belongs to the sandbox's user, who may change it.
    assert.equal(await sh(sbx, `stat -c %U:%a ${mount}/hello.txt; echo more >> ${mount}/hello.txt`), 'user:644\n')
    const info = await sbx.getInfo()
    assert.deepEqual(info.volumeMounts, [{ name, path: mount }])
    const listed = await Sandbox.list({ query: { metadata: { run, kind: 'holder' } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.volumeMounts), [[{ name, path: mount }]])

    // A second holder is refused while the first holds it.
    await assert.rejects(Sandbox.create({ volumeMounts: { [mount]: name }, timeoutMs: 60_000 }), /409.*attached to sandbox/)
    await assert.rejects(Volume.destroy(vol.volumeId), /409/)

    // Held: the files go through the holder, and each side sees the other's at once.
    await sbx.files.write(`${mount}/from-sbx.txt`, 'from the sandbox')
    assert.equal(await vol.readFile('/from-sbx.txt'), 'from the sandbox')
    assert.equal(await vol.readFile('/hello.txt'), 'from the API, twice\nmore\n')
    const bytes = await vol.readFile('/from-sbx.txt', { format: 'bytes' })
    assert.equal(Buffer.from(bytes).toString(), 'from the sandbox')
    const w = await vol.writeFile('/while-held.txt', 'held', { mode: 0o600 })
    assert.equal(w.mode, 0o600)
    assert.equal(await sh(sbx, `cat ${mount}/while-held.txt; stat -c %a:%u ${mount}/while-held.txt`), 'held600:1000\n')
    await assert.rejects(vol.writeFile('/while-held.txt', 'x'), sdk.VolumeError)
    await vol.writeFile('/while-held.txt', 'held, replaced', { force: true })
    assert.equal(await sh(sbx, `cat ${mount}/while-held.txt`), 'held, replaced')
    const deep = await vol.list('/', { depth: 3 })
    for (const p of ['/dir', '/dir/sub', '/dir/sub/deep.txt', '/from-sbx.txt', '/hello.txt', '/while-held.txt']) {
      assert.ok(deep.some((e) => e.path === p), `list depth 3 lacks ${p}: ${deep.map((e) => e.path)}`)
    }
    assert.ok(!deep.some((e) => e.path.includes('.lizard-upload-')), 'an upload file is left')
    const top = await vol.list('/')
    assert.ok(!top.some((e) => e.path === '/dir/sub'), 'list of depth 1 went deeper')
    assert.equal((await vol.getInfo('/dir')).type, 'directory')
    assert.equal(await vol.exists('/dir/sub/deep.txt'), true)
    assert.equal(await vol.exists('/dir/none'), false)
    const md = await vol.makeDir('/made-held', { mode: 0o700 })
    assert.equal(md.type, 'directory')
    assert.equal(await sh(sbx, `stat -c %a ${mount}/made-held`), '700\n')
    const upd = await vol.updateMetadata('/hello.txt', { mode: 0o640, uid: 1001 })
    assert.equal(upd.mode, 0o640)
    assert.equal(upd.uid, 1001)
    assert.equal(await sh(sbx, `stat -c %a:%u ${mount}/hello.txt`), '640:1001\n')
    await vol.remove('/dir')
    assert.equal(await sh(sbx, `test -e ${mount}/dir && echo there || echo gone`), 'gone\n')
    await assert.rejects(vol.remove('/dir'), sdk.VolumePathNotFoundError)
    // A link the sandbox makes out of the volume is not followed by the API.
    await sh(sbx, `ln -s /etc/passwd ${mount}/passwd`)
    await assert.rejects(vol.readFile('/passwd'), /403|leads out of the volume/)

    // A paused holder cannot be reached: a conflict, not a wrong answer.
    await sbx.pause()
    await assert.rejects(vol.readFile('/hello.txt'), /409.*paused/)
    await Sandbox.connect(sbx.sandboxId)
    assert.equal(await vol.readFile('/from-sbx.txt'), 'from the sandbox')

    // Free again once its holder is gone: the next holder sees it all.
    await sbx.kill()
    assert.equal(await vol.readFile('/from-sbx.txt'), 'from the sandbox')
    await vol.writeFile('/after.txt', 'after the holder')
    const next = await Sandbox.create({ volumeMounts: { [mount]: name }, timeoutMs: budget(120_000) })
    sbxs.push(next)
    assert.equal(await sh(next, `cat ${mount}/after.txt ${mount}/while-held.txt`), 'after the holderheld, replaced')
    await next.kill()

    const got = await Volume.getInfo(vol.volumeId)
    assert.equal(got.name, name)
    assert.equal(got.token, vol.token)
    const again = await Volume.connect(vol.volumeId)
    assert.equal(await again.readFile('/after.txt'), 'after the holder')
    assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === name))
  } finally {
    await Promise.all(sbxs.map((s) => s.kill().catch(() => {})))
    await Volume.destroy(vol.volumeId).catch(() => {})
  }
  assert.equal(await Volume.destroy(vol.volumeId), false)
  await assert.rejects(Volume.getInfo(vol.volumeId), sdk.VolumeNotFoundError)
  // Its token admits nothing any more.
  await assert.rejects(vol.readFile('/after.txt'), sdk.AuthenticationError)
})

test('volume calls refuse what lizard cannot do, naming the field', async () => {
  await assert.rejects(Volume.create('Not_A_Lizard_Name'), /name "Not_A_Lizard_Name"/)
  const name = `refuse-${run}-${sdkName}`
  const vol = await Volume.create(name)
  try {
    await assert.rejects(Volume.create(name), /409/)
    await assert.rejects(Sandbox.create({ volumeMounts: { '/data': vol } }), /volumeMounts\[0\]\.path "\/data": lizard mounts a sandbox's volume at \/workspace/)
    const other = await Volume.create(`${name}-2`)
    try {
      await assert.rejects(Sandbox.create({ volumeMounts: { [mount]: vol, '/other': other } }), /volumeMounts: 2 volumes/)
    } finally {
      await Volume.destroy(other.volumeId)
    }
    await assert.rejects(Sandbox.create({ volumeMounts: { [mount]: 'no-such-volume' } }), /404/)
    await assert.rejects(vol.list('/', { depth: 0 }), /400.*depth/)
    await assert.rejects(vol.remove('/'), /400.*root/)
    // Another volume's token admits nothing here.
    const forged = new Volume(vol.volumeId, name, 'lzvol.x.y')
    await assert.rejects(forged.list('/'), sdk.AuthenticationError)
    const res = await api('GET', `/volumecontent/${vol.volumeId}/dir?path=/`)
    assert.equal(res.status, 401, 'the API key is not a volume token')
    assert.equal(res.json?.code, '401')
  } finally {
    await Volume.destroy(vol.volumeId)
  }
})
