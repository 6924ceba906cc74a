// File watching with the official SDK: fs.watch, getEvents, close.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError } from '@lizard-build/sdk'
import { budget, withSandbox, sleep } from './helpers.mjs'

// drain polls getEvents until want(events) holds or budget(10 s) pass.
async function drain(watcher, want) {
  const all = []
  for (const end = Date.now() + budget(10_000); Date.now() < end;) {
    all.push(...(await watcher.getEvents()))
    if (want(all)) return all
    await sleep(100)
  }
  return all
}

const has = (evs, type, path) => evs.some((e) => e.type === type && e.path === path)

test('watch: create, write, remove; recursive or not; across pause and resume', async () => {
  await withSandbox(async (sb) => {
    await sb.fs.makeDir('/w/sub')
    const flat = await sb.fs.watch('/w')
    const deep = await sb.fs.watch('/w', { recursive: true })
    assert.deepEqual(await flat.getEvents(), [], 'nothing happened yet')

    await sb.fs.write('/w/a.txt', 'one')
    await sb.process.exec('echo two >> /w/a.txt && echo deep > /w/sub/b.txt && rm /w/a.txt')
    const evs = await drain(deep, (e) => has(e, 'remove', '/w/a.txt') && has(e, 'create', '/w/sub/b.txt'))
    assert.ok(has(evs, 'create', '/w/a.txt'), JSON.stringify(evs))
    assert.ok(has(evs, 'write', '/w/a.txt'), JSON.stringify(evs))
    assert.ok(has(evs, 'remove', '/w/a.txt'), JSON.stringify(evs))
    assert.ok(has(evs, 'create', '/w/sub/b.txt'), JSON.stringify(evs))
    assert.equal(evs.find((e) => e.path === '/w/sub/b.txt').name, 'b.txt')

    const flatEvs = await drain(flat, (e) => has(e, 'remove', '/w/a.txt'))
    assert.ok(has(flatEvs, 'create', '/w/a.txt'))
    assert.ok(!flatEvs.some((e) => e.path === '/w/sub/b.txt'), 'a non-recursive watch does not see subdirectories')

    await sb.pause()
    await sb.resume()
    await sb.process.exec('touch /w/after-resume')
    const later = await drain(deep, (e) => has(e, 'create', '/w/after-resume'))
    assert.ok(has(later, 'create', '/w/after-resume'), 'the watch survives pause and resume')

    await flat.close()
    await deep.close()
    await assert.rejects(deep.getEvents(), NotFoundError)
    await assert.rejects(sb.fs.watch('/no/such/dir'), NotFoundError)
  })
})
