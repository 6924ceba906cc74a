// A create through the official SDK takes a warm copy of its template (the
// Go test, TestTemplatePool, made the project's pool of base and waited for
// it to fill): the sandbox answers at once with the create's own settings.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget, collectLogs, lizard } from '../helpers.mjs'


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
      const msgs = (await collectLogs(sb, { tail: 100 }, (ls) => /^created from a warm copy of template base/.test(ls.at(-1).message))).map((l) => l.message)
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
    const msgs = (await collectLogs(sb, { tail: 100 }, (ls) => /^created \(template base, size nano\)/.test(ls.at(-1).message))).map((l) => l.message)
    assert.ok(!msgs.some((m) => m.includes('warm copy')), msgs.join(' | '))
    assert.equal((await sb.process.exec('true')).exitCode, 0)
  } finally {
    await sb.kill()
  }
})
