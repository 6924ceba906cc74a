// Schedules through the official SDK (sandbox.schedule(), Sandbox.*Schedule*):
// an interval runs on its due times with nextRunAt advancing, a run wakes a
// paused sandbox and puts it back to sleep, bad input is a 400 naming the
// field, quotas, and a killed sandbox's schedules go with it. Run by
// TestSchedules (schedule_test.go), not TestSDK: the interval test waits two
// real minutes (every is at least one minute).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, LimitExceededError } from '@lizard-build/sdk'
import { budget, withSandbox, sleep } from '../helpers.mjs'

// finishedRuns waits until the schedule has n finished runs and returns
// its runs, newest first.
async function finishedRuns(id, n, ms) {
  const end = Date.now() + ms
  for (;;) {
    const runs = await Sandbox.scheduleRuns(id, { limit: 50 })
    if (runs.filter((r) => r.finished).length >= n) return runs
    if (Date.now() > end) throw new Error(`${n} finished runs of ${id}: have ${JSON.stringify(runs)}`)
    await sleep(500)
  }
}

test('a schedule every minute runs on each due time, nextRunAt advancing', async () => {
  await withSandbox(async (sb) => {
    const s = await sb.schedule({ every: '1m', command: 'echo tick >> /root/ticks; echo ran; echo oops >&2', name: 'ticker' })
    assert.equal(s.sandboxId, sb.sandboxId)
    assert.equal(s.kind, 'command')
    assert.equal(s.every, '1m')
    assert.equal(s.everySeconds, 60)
    assert.equal(s.cron, null)
    assert.equal(s.timezone, 'UTC')
    assert.equal(s.timeoutSeconds, 600)
    assert.equal(s.enabled, true)
    assert.equal(s.name, 'ticker')
    assert.equal(s.running, false)
    assert.equal(s.lastRunAt, null)
    const first = Date.parse(s.nextRunAt)
    assert.ok(first > Date.now() && first <= Date.now() + 61_000, `nextRunAt ${s.nextRunAt}`)

    const runs = await finishedRuns(s.id, 2, budget(60_000) + 150_000)
    const [second, firstRun] = runs
    for (const r of [firstRun, second]) {
      assert.equal(r.status, 'succeeded', JSON.stringify(r))
      assert.equal(r.exitCode, 0)
      assert.equal(r.woke, false)
      assert.equal(r.slept, false)
      assert.equal(r.scheduleId, s.id)
      assert.equal(r.sandboxId, sb.sandboxId)
      assert.ok(r.finished && r.endedAt && r.durationMs >= 0)
      assert.match(r.output, /ran\n/)
      assert.match(r.output, /oops\n/)
    }
    assert.ok(Date.parse(second.startedAt) - Date.parse(firstRun.startedAt) >= 50_000, 'a minute apart')
    const after = await Sandbox.getSchedule(s.id)
    assert.ok(Date.parse(after.nextRunAt) >= first + 120_000, `nextRunAt advanced: ${s.nextRunAt} → ${after.nextRunAt}`)
    assert.equal((Date.parse(after.nextRunAt) - first) % 60_000, 0, 'on the minute grid')
    assert.equal(after.lastStatus, 'succeeded')
    assert.equal(after.consecutiveFailures, 0)
    assert.equal(after.skippedCount, 0)
    const ticks = (await sb.process.exec('cat /root/ticks')).stdout
    assert.ok(ticks.split('\n').filter(Boolean).length >= 2, ticks)

    // Off: no more runs; the listing and updates.
    const off = await Sandbox.updateSchedule(s.id, { enabled: false })
    assert.equal(off.enabled, false)
    assert.equal(off.nextRunAt, null)
    const cron = await Sandbox.updateSchedule(s.id, { cron: '30 9 * * *', timezone: 'Europe/Berlin', enabled: true })
    assert.equal(cron.every, null)
    assert.equal(cron.cron, '30 9 * * *')
    assert.equal(cron.timezone, 'Europe/Berlin')
    assert.equal(new Date(cron.nextRunAt).toLocaleTimeString('en-GB', { timeZone: 'Europe/Berlin' }), '09:30:00')
    assert.deepEqual((await sb.schedules()).map((x) => x.id), [s.id])
    assert.ok((await Sandbox.listSchedules()).some((x) => x.id === s.id))
    assert.deepEqual((await Sandbox.listSchedules({ sandboxId: sb.sandboxId })).map((x) => x.id), [s.id])
    await Sandbox.deleteSchedule(s.id)
    await assert.rejects(Sandbox.getSchedule(s.id), NotFoundError)
  })
})

test('a run of a paused sandbox wakes it and puts it back to sleep', async () => {
  await withSandbox(async (sb) => {
    await sb.fs.write('/root/note.txt', 'from before the pause')
    const s = await sb.schedule({ every: '1h', command: 'cat /root/note.txt; echo woke >> /root/woke' })
    assert.equal(await sb.pause(), true)
    await sb.waitForStatus('paused')
    const asked = await Sandbox.runSchedule(s.id)
    assert.equal(asked.enabled, true)
    const [run] = await finishedRuns(s.id, 1, budget(60_000))
    assert.equal(run.status, 'succeeded', JSON.stringify(run))
    assert.equal(run.woke, true)
    assert.equal(run.slept, true)
    assert.match(run.output, /from before the pause/)
    assert.equal((await sb.getInfo()).status, 'paused')
    const again = await Sandbox.getSchedule(s.id)
    assert.equal(again.nextRunAt, s.nextRunAt, 'a run asked for leaves the next due time')

    // A running sandbox is left running.
    assert.equal(await sb.resume(), true)
    await sb.waitForStatus('running')
    await Sandbox.runSchedule(s.id)
    const [second] = await finishedRuns(s.id, 2, budget(60_000))
    assert.equal(second.woke, false)
    assert.equal(second.slept, false)
    assert.equal((await sb.getInfo()).status, 'running')
    assert.equal((await sb.process.exec('wc -l < /root/woke')).stdout.trim(), '2')
  })
})

test('failures count, switch the schedule off after five, and runSchedule switches it on', async () => {
  await withSandbox(async (sb) => {
    const s = await sb.schedule({ every: '1h', command: 'echo no; exit 3' })
    for (let i = 1; i <= 5; i++) {
      await Sandbox.runSchedule(s.id)
      await finishedRuns(s.id, i, budget(60_000))
    }
    const off = await Sandbox.getSchedule(s.id)
    assert.equal(off.enabled, false)
    assert.equal(off.consecutiveFailures, 5)
    assert.match(off.disabledReason, /5 failed runs/)
    const [last] = await Sandbox.scheduleRuns(s.id, { limit: 1 })
    assert.equal(last.status, 'failed')
    assert.equal(last.exitCode, 3)
    const on = await Sandbox.runSchedule(s.id)
    assert.equal(on.enabled, true)
    assert.equal(on.disabledReason, null)
    assert.equal(on.consecutiveFailures, 0)
    await finishedRuns(s.id, 6, budget(60_000))

    const slow = await sb.schedule({ every: '1h', command: 'sleep 20', timeoutSeconds: 2 })
    await Sandbox.runSchedule(slow.id)
    const [timedOut] = await finishedRuns(slow.id, 1, budget(60_000))
    assert.equal(timedOut.status, 'timeout', JSON.stringify(timedOut))
  })
})

test('bad input is a 400 naming the field', async () => {
  await withSandbox(async (sb) => {
    const cases = [
      [{ command: 'x' }, 'every'],
      [{ every: '5m', cron: '* * * * *', command: 'x' }, 'every'],
      [{ every: '30s', command: 'x' }, 'every'],
      [{ every: 59, command: 'x' }, 'every'],
      [{ every: 'often', command: 'x' }, 'every'],
      [{ cron: '* * * *', command: 'x' }, 'cron'],
      [{ cron: '99 * * * *', command: 'x' }, 'cron'],
      [{ cron: 'every day', command: 'x' }, 'cron'],
      [{ cron: '0 9 * * *', timezone: 'Mars/Olympus_Mons', command: 'x' }, 'timezone'],
      [{ every: '5m' }, 'command'],
      [{ every: '5m', command: 'x', prompt: 'y' }, 'command'],
      [{ every: '5m', command: 'x', timeoutSeconds: 0 }, 'timeoutSeconds'],
      [{ every: '5m', prompt: 'y', agent: 'gemini' }, 'agent'],
      [{ every: '5m', prompt: 'y', reasoningEffort: 'max' }, 'reasoningEffort'],
      // base has no coding agent of its own, nor codex installed.
      [{ every: '5m', prompt: 'y' }, 'agent'],
      [{ every: '5m', prompt: 'y', agent: 'codex' }, 'agent'],
    ]
    for (const [opts, field] of cases) {
      await assert.rejects(sb.schedule(opts), (e) => {
        assert.equal(e.status, 400, `${JSON.stringify(opts)}: ${e.message}`)
        assert.match(e.message, new RegExp(`\\b${field}\\b`), `${JSON.stringify(opts)}: ${e.message}`)
        return true
      })
    }
    const s = await sb.schedule({ every: 300, command: 'true' })
    assert.equal(s.every, '5m')
    await assert.rejects(Sandbox.updateSchedule(s.id, { every: '10s' }), (e) => e.status === 400 && /every/.test(e.message))
    await assert.rejects(Sandbox.updateSchedule(s.id, { timezone: 'Nowhere/Land' }), (e) => e.status === 400 && /timezone/.test(e.message))
    await assert.rejects(Sandbox.scheduleRuns(s.id, { limit: 1000 }), (e) => e.status === 400 && /limit/.test(e.message))
    await assert.rejects(Sandbox.getSchedule('sch_nope'), NotFoundError)
    await assert.rejects(Sandbox.runSchedule('sch_nope'), NotFoundError)

    // Broken JSON, and a body that is not an object.
    for (const body of ['{"every": "5m",', '[1]', '"every"']) {
      const res = await fetch(`${process.env.LIZARD_API_URL}/api/sandboxes/${sb.sandboxId}/schedules`, {
        method: 'POST', headers: { 'X-API-Key': process.env.LIZARD_API_KEY, 'Content-Type': 'application/json' }, body,
      })
      assert.equal(res.status, 400, body)
      assert.ok((await res.json()).message, body)
    }
    await assert.rejects(new Sandbox({ sandboxId: 'sb_nope' }).schedule({ every: '5m', command: 'x' }), NotFoundError)
  })
})

test('schedules per sandbox are limited, and a killed sandbox takes its schedules', async () => {
  let id
  let ids = []
  await withSandbox(async (sb) => {
    id = sb.sandboxId
    for (let i = 0; i < 10; i++) ids.push((await sb.schedule({ every: '1h', command: `echo ${i}` })).id)
    await assert.rejects(sb.schedule({ every: '1h', command: 'echo 11' }), (e) => {
      assert.ok(e instanceof LimitExceededError, e.message)
      assert.match(e.message, /schedules-per-sandbox 10 of 10/)
      return true
    })
  })
  for (const sid of ids) await assert.rejects(Sandbox.getSchedule(sid), NotFoundError)
  assert.equal((await Sandbox.listSchedules({ sandboxId: id })).length, 0)
})
