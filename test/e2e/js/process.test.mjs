import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget, withSandbox, sleep } from './helpers.mjs'

test('exec: exit codes, argv, workdir, user', async () => {
  await withSandbox(async (sb) => {
    const fail = await sb.process.exec('echo oops >&2; exit 3')
    assert.equal(fail.exitCode, 3)
    assert.equal(fail.stderr, 'oops\n')
    const tricky = `it's "quoted" $HOME; rm -rf / && echo no`
    const argv = await sb.process.exec(['printf', '%s', tricky])
    assert.equal(argv.exitCode, 0)
    assert.equal(argv.stdout, tricky)
    const long = 'x'.repeat(110_000)
    const big = await sb.process.exec(['sh', '-c', 'printf %s "$1" | wc -c', 'sh', long])
    assert.equal(big.stdout.trim(), '110000')
    const wd = await sb.process.exec('pwd', { workdir: '/usr/share' })
    assert.equal(wd.stdout, '/usr/share\n')
    const who = await sb.process.exec('id -un; echo $HOME', { user: 'user' })
    assert.equal(who.stdout, 'user\n/home/user\n')
    const missing = await sb.process.exec(['no-such-binary'])
    assert.equal(missing.exitCode, 127)
  })
})

test('exec: streamed output, pid event, and long lines', async () => {
  await withSandbox(async (sb) => {
    const lines = []
    let pid
    const r = await sb.process.exec('for i in 1 2 3; do echo line$i; done; echo err >&2; head -c 50000 /dev/zero | tr "\\0" a; echo', {
      onStdout: (l) => lines.push(l),
      onPid: (p) => { pid = p },
    })
    assert.equal(r.exitCode, 0)
    assert.deepEqual(lines.slice(0, 3), ['line1', 'line2', 'line3'])
    assert.equal(lines[3].length, 50000)
    assert.equal(r.stderr, 'err')
    assert.ok(Number.isInteger(pid) && pid > 1, `pid event ${pid}`)
  })
})

test('exec: a background command does not hold the stream open', async () => {
  await withSandbox(async (sb) => {
    const plain = await sb.process.exec('sleep 100 & echo started')
    assert.equal(plain.stdout, 'started\n')
    const streamed = await sb.process.exec('sleep 100 & echo started', { onStdout: () => {} })
    assert.equal(streamed.stdout, 'started')
    const ps = await sb.process.exec('pgrep -c -x sleep')
    assert.equal(ps.stdout.trim(), '2', 'background sleeps keep running')
  })
})

test('exec: timeout kills the command', async () => {
  await withSandbox(async (sb) => {
    const start = Date.now()
    await sb.process.exec('sleep 30', { timeoutMs: 1_000 }).catch(() => {})
    assert.ok(Date.now() - start < budget(20_000))
    await sleep(500)
    const ps = await sb.process.exec('pgrep -x sleep || true')
    assert.equal(ps.stdout, '', 'the timed-out sleep is gone')
  })
})

test('exec: output over 512 KiB is truncated', async () => {
  await withSandbox(async (sb) => {
    const r = await sb.process.exec('head -c 2000000 /dev/zero | tr "\\0" "a" | fold -w 1000')
    assert.equal(r.truncated, true)
    assert.ok(r.stdout.length <= 512 * 1024)
    assert.ok(r.stdout.length > 500 * 1024)
  })
})

test('processes: list and signal the whole tree', async () => {
  await withSandbox(async (sb) => {
    let pid
    const running = sb.process.exec('sleep 1000 & sleep 1001; wait', {
      onPid: (p) => { pid = p },
      timeoutMs: 60_000,
    })
    for (const end = Date.now() + budget(5_000); !pid && Date.now() < end;) await sleep(50)
    assert.ok(pid > 1, 'pid event arrived')
    const procs = await sb.process.list()
    const mine = procs.find((p) => p.pid === pid)
    assert.ok(mine, `exec-started processes: ${JSON.stringify(procs)}`)
    assert.deepEqual(mine.cmd, ['/bin/sh', '-c', 'sleep 1000 & sleep 1001; wait'])
    assert.equal(mine.command, 'sleep 1000 & sleep 1001; wait')
    assert.equal(typeof mine.startedAt, 'string')
    // The pid event comes when the shell starts; its second sleep follows
    // a fork later.
    let sleeps
    for (const end = Date.now() + budget(5_000); sleeps !== '2' && Date.now() < end;) {
      if (sleeps !== undefined) await sleep(50)
      sleeps = (await sb.process.exec('pgrep -c -x sleep')).stdout.trim()
    }
    assert.equal(sleeps, '2')
    await sb.process.kill(pid, 'SIGKILL')
    const result = await running
    assert.equal(result.exitCode, 137)
    const left = await sb.process.exec('pgrep -x sleep || true')
    assert.equal(left.stdout, '', 'every sleep of the tree is gone')
    assert.ok(!(await sb.process.list()).some((p) => p.pid === pid))
    await assert.rejects(sb.process.kill(pid), (e) => e.status === 404)
    await assert.rejects(sb.process.kill(1, 'SIGBOGUS'), (e) => e.status === 400)
  })
})
