// A create through the official SDK takes a warm copy of its template (the
// Go test, TestTemplatePool, made the project's pool of base and waited for
// it to fill): the sandbox answers at once with the create's own settings.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget, lizard } from '../helpers.mjs'

// logLines replays the sandbox's log until want matches a message.
async function logLines(sb, want) {
  const ac = new AbortController()
  const timer = setTimeout(() => ac.abort(), budget(20_000))
  const msgs = []
  try {
    for await (const ev of sb.logs({ tail: 100, signal: ac.signal })) {
      msgs.push(JSON.parse(ev.data).message)
      if (want.test(msgs.at(-1))) break
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e
  } finally {
    clearTimeout(timer)
  }
  return msgs
}

test('a create takes a warm copy, with its own envs, metadata and hostname', async () => {
  const sbs = []
  try {
    // Two at once: each takes a copy of its own.
    sbs.push(...await Promise.all([1, 2].map((i) => lizard.create('base', {
      timeoutMs: budget(120_000), envs: { POOL_GREETING: `hello-${i}` }, metadata: { who: `pool-${i}` },
    }))))
    assert.notEqual(sbs[0].sandboxId, sbs[1].sandboxId)
    for (const [i, sb] of sbs.entries()) {
      const r = await sb.process.exec('echo "$POOL_GREETING"; hostname; cat /proc/1/cmdline >/dev/null && echo up')
      assert.equal(r.exitCode, 0, r.stderr)
      assert.deepEqual(r.stdout.trim().split('\n'), [`hello-${i + 1}`, sb.sandboxId, 'up'])
      const info = await sb.getInfo()
      assert.equal(info.metadata.who, `pool-${i + 1}`)
      assert.equal(info.status, 'running')
      const msgs = await logLines(sb, /^created from a warm copy of template base/)
      assert.ok(msgs.some((m) => m.startsWith('created from a warm copy of template base')), msgs.join(' | '))
    }
    // Files and processes work as in any sandbox.
    await sbs[0].fs.write('/tmp/pool.txt', 'mine')
    assert.equal(await sbs[0].fs.read('/tmp/pool.txt'), 'mine')
    assert.equal((await sbs[1].process.exec('cat /tmp/pool.txt')).exitCode, 1)
  } finally {
    await Promise.all(sbs.map((sb) => sb.kill()))
  }
})

test('a create of another size boots', async () => {
  // Another size than the pool's: booted, not claimed.
  const sb = await lizard.create('base', { timeoutMs: budget(120_000), size: 'nano' })
  try {
    const msgs = await logLines(sb, /^created \(template base, size nano\)/)
    assert.ok(!msgs.some((m) => m.includes('warm copy')), msgs.join(' | '))
    assert.equal((await sb.process.exec('true')).exitCode, 0)
  } finally {
    await sb.kill()
  }
})
