// The sandbox log with the official SDK's logs(): lifecycle events and
// command output, with timestamps, replayed by tail and then followed live.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { collectLogs as collect, withSandbox } from './helpers.mjs'


test('logs: lifecycle events and command output, tail then live', async () => {
  await withSandbox(async (sb) => {
    await sb.process.exec('echo hello-log; echo oops-log >&2')
    await sb.pause()
    await sb.resume()
    const replay = await collect(sb, { tail: 100 }, (ls) => ls.some((l) => l.message === 'resumed'))
    const msgs = replay.map((l) => l.message)
    assert.ok(msgs[0].startsWith('created'), msgs.join(' | '))
    for (const m of ['hello-log', 'oops-log', 'paused', 'resumed']) assert.ok(msgs.includes(m), `${m} in ${msgs.join(' | ')}`)
    const out = replay.find((l) => l.message === 'hello-log')
    assert.equal(out.type, 'stdout')
    assert.ok(out.pid > 0)
    assert.equal(replay.find((l) => l.message === 'oops-log').type, 'stderr')
    assert.ok(!Number.isNaN(Date.parse(out.timestamp)))

    // A background process keeps writing after its exec returned.
    await sb.process.exec("sh -c 'sleep 0.5; echo from-the-background; sleep 0.5; echo later-background' &")
    const bg = await collect(sb, { tail: 1000 }, (ls) => ls.some((l) => l.message === 'later-background'))
    const line = bg.find((l) => l.message === 'from-the-background')
    assert.ok(line, `background output in the log: ${bg.map((l) => l.message).join(' | ')}`)
    assert.equal(line.background, true)
    assert.equal(line.type, 'stdout')

    const live = collect(sb, { tail: 0 }, (ls) => ls.some((l) => l.message === 'live-line'))
    await new Promise((r) => setTimeout(r, 300))
    await sb.process.exec('echo live-line')
    const got = await live
    assert.ok(got.some((l) => l.message === 'live-line'), 'new lines arrive on a live stream')
    assert.ok(!got.some((l) => l.message === 'hello-log'), 'tail 0 replays nothing')
  })
})
