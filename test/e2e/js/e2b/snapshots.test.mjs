// E2B's snapshots through the E2B SDK: a snapshot keeps memory and running
// processes, sandboxes made from it (by its id or its name) go on from it,
// each on its own; listSnapshots pages and filters; deleteSnapshot.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget } from '../budget.mjs'
import { Sandbox, api, sdk, sleep } from './helpers.mjs'

const run = Math.random().toString(36).slice(2)
const sdkName = process.env.E2B_SDK
console.log(`e2b snapshot tests: run ${run}, sdk ${sdkName}`)

// count reads the counter the sandbox's background loop keeps. The loop
// renames each count into place: a read (or a snapshot) never sees the
// file truncated half-way through a write, which would read as 0.
async function count(sbx) {
  const text = (await sbx.files.read('/tmp/count')).trim()
  const n = Number(text)
  assert.ok(text !== '' && Number.isInteger(n), `count ${JSON.stringify(text)}`)
  return n
}

// growsFrom waits until the sandbox's counter is past n: its loop runs.
// Until the loop's first rename there is no file: that reads as not yet
// counting (-1), anything else the read throws fails the test.
async function growsFrom(sbx, n) {
  const current = () => count(sbx).catch((e) => {
    if (e instanceof sdk.FileNotFoundError) return -1
    throw e
  })
  let now = await current()
  for (const end = Date.now() + budget(15_000); now <= n && Date.now() < end;) {
    await sleep(200)
    now = await current()
  }
  assert.ok(now > n, `the counter of ${sbx.sandboxId} stays at ${now} (was ${n})`)
  return now
}

test('a snapshot keeps a running counter: two sandboxes made from it go on counting, each on its own', async () => {
  const timeoutMs = budget(180_000)
  const src = await Sandbox.create({ metadata: { run, kind: 'source' }, timeoutMs })
  const made = []
  try {
    // The loop's count lives in the shell's memory; the file only shows it.
    await src.commands.run('i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done', { background: true })
    await src.files.write('/home/user/note.txt', 'before the snapshot')
    const before = await growsFrom(src, 3)
    const name = `counter-${run}-${sdkName}`
    const snap = await src.createSnapshot({ name })
    assert.match(snap.snapshotId, /^snap_/)
    assert.deepEqual(snap.names, [name])
    // The source keeps running.
    await growsFrom(src, before)
    // From its id and from its name: both are a template to create from.
    for (const ref of [snap.snapshotId, name]) {
      made.push(await Sandbox.create(ref, { metadata: { run, kind: 'copy', ref }, timeoutMs, envs: { FROM_CREATE: ref } }))
    }
    for (const copy of made) {
      assert.notEqual(copy.sandboxId, src.sandboxId)
      // It starts from the snapshot's count, not from 0, and counts on.
      const first = await count(copy)
      assert.ok(first >= before, `${copy.sandboxId} starts at ${first}, below ${before}: not the snapshot's memory`)
      await growsFrom(copy, first)
      assert.equal(await copy.files.read('/home/user/note.txt'), 'before the snapshot')
      const info = await copy.getInfo()
      assert.equal(info.state, 'running')
      assert.equal(info.metadata.kind, 'copy')
      assert.equal(info.metadata.ref, copy === made[0] ? snap.snapshotId : name)
      assert.equal((await copy.commands.run('echo $FROM_CREATE')).stdout.trim(), info.metadata.ref)
    }
    // Each copy is a sandbox of its own.
    await made[0].files.write('/home/user/note.txt', 'changed in the first copy')
    assert.equal(await made[1].files.read('/home/user/note.txt'), 'before the snapshot')
    assert.equal(await src.files.read('/home/user/note.txt'), 'before the snapshot')
    await made[0].files.write('/tmp/stop', '')
    let stopped = await count(made[0])
    await sleep(budget(500))
    stopped = await count(made[0])
    await sleep(budget(500))
    assert.equal(await count(made[0]), stopped)
    await growsFrom(made[1], await count(made[1]))
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    // Its copies outlive it.
    assert.equal(await made[1].isRunning(), true)
    await assert.rejects(Sandbox.create(snap.snapshotId, { timeoutMs }), /404|not found/i)
  } finally {
    await Promise.all([src, ...made].map((s) => s.kill()))
  }
})

test('listSnapshots pages with a limit and filters by sandbox and name; deleteSnapshot says whether it deleted', async () => {
  const src = await Sandbox.create({ metadata: { run, kind: 'list' }, timeoutMs: budget(180_000) })
  const ids = []
  try {
    for (let i = 0; i < 3; i++) {
      ids.push((await src.createSnapshot(i === 1 ? { name: `list-${run}-${sdkName}` } : undefined)).snapshotId)
    }
    const pager = Sandbox.listSnapshots({ sandboxId: src.sandboxId, limit: 2 })
    assert.equal(pager.hasNext, true)
    const first = await pager.nextItems()
    assert.equal(first.length, 2)
    assert.equal(pager.hasNext, true)
    const second = await pager.nextItems()
    assert.equal(second.length, 1)
    assert.equal(pager.hasNext, false)
    const listed = [...first, ...second].map((s) => s.snapshotId)
    // Newest first.
    assert.deepEqual(listed, [...ids].reverse())
    assert.deepEqual(second[0].names, [])
    assert.deepEqual(first[1].names, [`list-${run}-${sdkName}`])
    // The instance's list is this sandbox's.
    const mine = await src.listSnapshots().nextItems()
    assert.deepEqual(mine.map((s) => s.snapshotId).sort(), [...ids].sort())
    const named = await Sandbox.listSnapshots({ name: `list-${run}-${sdkName}` }).nextItems()
    assert.deepEqual(named.map((s) => s.snapshotId), [ids[1]])
    assert.deepEqual(await Sandbox.listSnapshots({ name: `nothing-${run}` }).nextItems(), [])
    const all = await Sandbox.listSnapshots().nextItems()
    for (const id of ids) assert.ok(all.some((s) => s.snapshotId === id), `${id} is not in the project's list`)

    assert.equal(await Sandbox.deleteSnapshot(ids[0]), true)
    assert.equal(await Sandbox.deleteSnapshot(ids[0]), false)
    const left = await src.listSnapshots().nextItems()
    assert.deepEqual(left.map((s) => s.snapshotId).sort(), ids.slice(1).sort())
    // By name too, as E2B deletes the snapshot's template.
    assert.equal(await Sandbox.deleteSnapshot(`list-${run}-${sdkName}`), true)
    assert.equal(await Sandbox.deleteSnapshot(ids[2]), true)
    assert.deepEqual(await src.listSnapshots().nextItems(), [])
  } finally {
    for (const id of ids) await Sandbox.deleteSnapshot(id).catch(() => {})
    await src.kill()
  }
})

test('snapshot calls refuse what they cannot do, naming the field', async () => {
  const src = await Sandbox.create({ metadata: { run, kind: 'refuse' }, timeoutMs: budget(120_000) })
  try {
    await assert.rejects(src.createSnapshot({ name: 'base' }), /name "base": a template has that name/)
    await assert.rejects(src.createSnapshot({ name: 'team/snap:v1' }), /name "team\/snap:v1"/)
    const snap = await src.createSnapshot()
    try {
      await assert.rejects(Sandbox.create(snap.snapshotId, { volumeMounts: { '/workspace': 'v' } }), /volumeMounts: a sandbox made from snapshot/)
      await assert.rejects(Sandbox.create(snap.snapshotId, { allowInternetAccess: false }), /allow_internet_access/)
      await assert.rejects(Sandbox.create(snap.snapshotId, { network: { allowPublicTraffic: false } }), /network: a sandbox made from snapshot/)
    } finally {
      await Sandbox.deleteSnapshot(snap.snapshotId)
    }
    for (const [method, path, body, want] of [
      ['GET', '/snapshots?limit=0', undefined, 400],
      ['GET', '/snapshots?nextToken=bm9wZQ', undefined, 400],
      ['POST', '/sandboxes/nosuch/snapshots', {}, 404],
      ['DELETE', '/templates/snap_nosuch', undefined, 404],
    ]) {
      const res = await api(method, path, body)
      assert.equal(res.status, want, `${method} ${path}: ${res.text}`)
      assert.equal(res.json?.code, want)
    }
  } finally {
    await src.kill()
  }
})
