// envd through the E2B SDK: the default user, commands (output, exit codes,
// envs, cwd, user, timeouts, background + connect, stdin, kill, list), pty,
// and files (read and write of text, bytes, streams and many files, list
// with depth, exists, getInfo, rename, remove, makeDir, symlinks, metadata,
// watchDir with entries, signed URLs).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget } from '../budget.mjs'
import { sdk, Sandbox, withSandbox, api, sleep } from './helpers.mjs'

const run = Math.random().toString(36).slice(2)
console.log(`e2b envd tests: run ${run}, sdk ${process.env.E2B_SDK}`)

// until polls cond for up to budget(20 s).
async function until(what, cond) {
  for (const end = Date.now() + budget(20_000); Date.now() < end;) {
    if (await cond()) return
    await sleep(50)
  }
  assert.fail(`timed out waiting for ${what}`)
}

test('commands: output, exit codes, envs, cwd, user, timeouts', async () => {
  await withSandbox(async (sbx) => {
    const r = await sbx.commands.run('echo out; echo err >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\n')
    assert.equal(r.stderr, 'err\n')

    const err = await sbx.commands.run('echo partial; exit 7').catch((e) => e)
    assert.ok(err instanceof sdk.CommandExitError, `want CommandExitError, got ${err}`)
    assert.equal(err.exitCode, 7)
    assert.equal(err.stdout, 'partial\n')

    const env = await sbx.commands.run('echo "$GREETING"', { envs: { GREETING: 'hi there' } })
    assert.equal(env.stdout, 'hi there\n')
    const cwd = await sbx.commands.run('pwd', { cwd: '/tmp' })
    assert.equal(cwd.stdout, '/tmp\n')
    const who = await sbx.commands.run('id -un; pwd', { user: 'user' })
    assert.equal(who.stdout, 'user\n/home/user\n')
    const root = await sbx.commands.run('id -un', { user: 'root' })
    assert.equal(root.stdout, 'root\n')

    const lines = []
    await sbx.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => lines.push(d) })
    assert.equal(lines.join(''), 'line1\nline2\nline3\n')

    // timeoutMs bounds the command: it is killed at the deadline.
    await assert.rejects(sbx.commands.run('echo $$ > /tmp/sleeper.pid; sleep 600', { timeoutMs: 1500 }), sdk.TimeoutError)
    await until('the timed-out command to die', async () => {
      const r = await sbx.commands.run('kill -0 $(cat /tmp/sleeper.pid) 2>/dev/null && echo alive || echo dead')
      return r.stdout === 'dead\n'
    })
  })
})

test('the default user is user, in /home/user, as in E2B', async () => {
  await withSandbox(async (sbx) => {
    assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
    assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
    const info = await sbx.files.write(`default-${run}.txt`, 'mine')
    assert.equal(info.path, `/home/user/default-${run}.txt`)
    const st = await sbx.files.getInfo(`default-${run}.txt`)
    assert.equal(st.owner, 'user')
    assert.equal(st.group, 'user')
    assert.equal((await sbx.commands.run(`stat -c '%U %u' /home/user/default-${run}.txt`)).stdout, 'user 1000\n')
    // Naming root still runs as root, in its home.
    assert.equal((await sbx.commands.run('whoami; pwd', { user: 'root' })).stdout, 'root\n/root\n')
    // user may not write root's home.
    await assert.rejects(sbx.files.write('/root/denied.txt', 'x'), sdk.SandboxError)
  })
})

test('commands: background, list, stdin, disconnect and connect', async () => {
  await withSandbox(async (sbx) => {
    const got = []
    const h = await sbx.commands.run('read a; echo "got $a"; read b; echo "got $b"', { background: true, stdin: true, envs: { LISTED: 'yes' }, onStdout: (d) => got.push(d) })
    assert.ok(h.pid > 0)
    const listed = await sbx.commands.list()
    const mine = listed.find((p) => p.pid === h.pid)
    assert.ok(mine, `pid ${h.pid} not in ${JSON.stringify(listed)}`)
    assert.equal(mine.cmd, '/bin/bash')
    // Each process's envs as its start gave them.
    assert.deepEqual(mine.envs, { LISTED: 'yes' })

    await sbx.commands.sendStdin(h.pid, 'one\n')
    await until('the first answer', () => got.join('').includes('got one'))
    // Leaving does not end the process; a new connection sees what follows.
    await h.disconnect()
    const again = await sbx.commands.connect(h.pid)
    await sbx.commands.sendStdin(h.pid, 'two\n')
    const r = await again.wait()
    assert.equal(r.exitCode, 0)
    assert.match(r.stdout, /got two/)
  })
})

test('commands: kill', async () => {
  await withSandbox(async (sbx) => {
    const sleeper = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await sbx.commands.kill(sleeper.pid), true)
    const killed = await sleeper.wait().catch((e) => e)
    assert.ok(killed instanceof sdk.CommandExitError, `want CommandExitError, got ${killed}`)
    assert.equal(killed.exitCode, -1)
    assert.equal(await sbx.commands.kill(999999), false)
  })
})

test('commands: closeStdin', async () => {
  await withSandbox(async (sbx) => {
    const cat = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(cat.pid, 'abc')
    await sbx.commands.closeStdin(cat.pid)
    assert.equal((await cat.wait()).stdout, 'abc')
  })
})

test('pty: create, input, resize, kill', async () => {
  await withSandbox(async (sbx) => {
    let out = ''
    const dec = new TextDecoder()
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) }, envs: { PS1: '$ ' } })
    await sbx.pty.resize(pty.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo $((6*7))x\n'))
    await until('pty output', () => out.includes('40 120') && out.includes('42x'))
    assert.equal(await sbx.pty.kill(pty.pid), true)
    await pty.wait().catch(() => {})
  })
})

test('files: read, write, list, exists, getInfo, rename, remove, makeDir', async () => {
  await withSandbox(async (sbx) => {
    const dir = `/tmp/files-${run}`
    const info = await sbx.files.write(`${dir}/a.txt`, 'hello')
    assert.equal(info.path, `${dir}/a.txt`)
    assert.equal(await sbx.files.read(`${dir}/a.txt`), 'hello')

    const bytes = new Uint8Array(256).map((_, i) => i)
    await sbx.files.write(`${dir}/b.bin`, bytes)
    assert.deepEqual(await sbx.files.read(`${dir}/b.bin`, { format: 'bytes' }), bytes)

    const stream = await sbx.files.read(`${dir}/a.txt`, { format: 'stream' })
    let text = ''
    for await (const c of stream) text += new TextDecoder().decode(c)
    assert.equal(text, 'hello')
    const big = 'x'.repeat(1 << 20)
    await sbx.files.write(`${dir}/stream.txt`, new Blob([big]).stream())
    assert.equal((await sbx.files.read(`${dir}/stream.txt`)).length, big.length)

    const many = await sbx.files.write([1, 2, 3].map((i) => ({ path: `${dir}/many/${i}.txt`, data: `n${i}` })))
    assert.equal(many.length, 3)
    assert.equal(await sbx.files.read(`${dir}/many/2.txt`), 'n2')

    // Relative paths are the user's home's.
    await sbx.files.write(`rel-${run}.txt`, 'home')
    assert.equal((await sbx.commands.run(`cat ~/rel-${run}.txt`)).stdout, 'home')

    const top = await sbx.files.list(dir)
    assert.deepEqual(top.map((e) => e.name).sort(), ['a.txt', 'b.bin', 'many', 'stream.txt'])
    assert.equal(top.find((e) => e.name === 'many').type, 'dir')
    const deep = await sbx.files.list(dir, { depth: 2 })
    assert.ok(deep.some((e) => e.path === `${dir}/many/3.txt`), JSON.stringify(deep.map((e) => e.path)))

    assert.equal(await sbx.files.exists(`${dir}/a.txt`), true)
    assert.equal(await sbx.files.exists(`${dir}/nope`), false)
    const st = await sbx.files.getInfo(`${dir}/a.txt`)
    assert.equal(st.size, 5)
    assert.equal(st.type, 'file')
    assert.ok(st.modifiedTime instanceof Date)

    const moved = await sbx.files.rename(`${dir}/a.txt`, `${dir}/c.txt`)
    assert.equal(moved.path, `${dir}/c.txt`)
    assert.equal(await sbx.files.exists(`${dir}/a.txt`), false)
    await sbx.files.remove(`${dir}/c.txt`)
    assert.equal(await sbx.files.exists(`${dir}/c.txt`), false)
    await assert.rejects(sbx.files.read(`${dir}/c.txt`), sdk.FileNotFoundError)

    assert.equal(await sbx.files.makeDir(`${dir}/new/deep`), true)
    assert.equal(await sbx.files.makeDir(`${dir}/new/deep`), false)
  })
})

test('files: watchDir, recursive too', async () => {
  await withSandbox(async (sbx) => {
    const dir = `/tmp/watch-${run}`
    await sbx.files.makeDir(`${dir}/sub`)
    const flat = []
    const deep = []
    const w1 = await sbx.files.watchDir(dir, (e) => flat.push(`${e.type} ${e.name}`))
    const w2 = await sbx.files.watchDir(dir, (e) => deep.push(`${e.type} ${e.name}`), { recursive: true })
    await sbx.files.write(`${dir}/top.txt`, 'x')
    await sbx.files.write(`${dir}/sub/inner.txt`, 'y')
    await until('watch events', () => flat.some((e) => e.endsWith(' top.txt')) && deep.some((e) => e.endsWith(' sub/inner.txt')))
    assert.ok(!flat.some((e) => e.includes('inner.txt')), `non-recursive watch saw ${flat}`)
    await w1.stop()
    await w2.stop()
  })
})

test('files: remove of nothing, symlink targets, watchDir of directories only, as E2B\'s envd', async () => {
  await withSandbox(async (sbx) => {
    // Removing a path that is not there succeeds.
    await sbx.files.remove(`never-there-${run}.txt`)
    await sbx.files.remove(`/tmp/no/such/dir-${run}`)

    // A symlink's target is absolute, a relative one taken from the link's directory.
    await sbx.files.write(`link-target-${run}.txt`, 'x')
    await sbx.commands.run(`ln -s link-target-${run}.txt link-${run} && mkdir -p sub-${run} && ln -s ../link-target-${run}.txt sub-${run}/up`)
    const link = await sbx.files.getInfo(`link-${run}`)
    assert.equal(link.type, 'symlink')
    assert.equal(link.symlinkTarget, `/home/user/link-target-${run}.txt`)
    const listed = await sbx.files.list(`sub-${run}`)
    assert.equal(listed.find((e) => e.name === 'up').symlinkTarget, `/home/user/link-target-${run}.txt`)

    // Only directories are watched; a missing one is not found.
    await assert.rejects(sbx.files.watchDir(`link-target-${run}.txt`, () => {}), sdk.InvalidArgumentError)
    await assert.rejects(sbx.files.watchDir(`no-such-dir-${run}`, () => {}), sdk.FileNotFoundError)
  })
})

test('files: metadata, and entries in watch events (envd 0.6.2-0.6.4)', async () => {
  await withSandbox(async (sbx) => {
    const metadata = { author: 'lizard', purpose: 'e2e' }
    const one = await sbx.files.write(`md-${run}.txt`, 'with metadata', { metadata })
    assert.deepEqual(one.metadata, metadata)
    assert.deepEqual((await sbx.files.getInfo(`md-${run}.txt`)).metadata, metadata)
    const streamed = await sbx.files.write(`md-stream-${run}.txt`, 'streamed', { metadata, useOctetStream: true })
    assert.deepEqual(streamed.metadata, metadata)
    const moved = await sbx.files.rename(`md-${run}.txt`, `md-moved-${run}.txt`)
    assert.deepEqual(moved.metadata, metadata)
    assert.deepEqual((await sbx.files.list('.')).find((e) => e.name === `md-moved-${run}.txt`).metadata, metadata)
    // Overwriting without metadata leaves none; setfattr-style attributes show.
    assert.equal((await sbx.files.write(`md-moved-${run}.txt`, 'plain')).metadata, undefined)
    assert.equal((await sbx.files.getInfo(`md-moved-${run}.txt`)).metadata, undefined)
    await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/md-moved-${run}.txt', 'user.e2b.by', b'hand')"`)
    assert.deepEqual((await sbx.files.getInfo(`md-moved-${run}.txt`)).metadata, { by: 'hand' })

    await sbx.files.makeDir(`watched-${run}`)
    let resolve
    const seen = new Promise((r) => { resolve = r })
    const w = await sbx.files.watchDir(`watched-${run}`, (e) => {
      if (e.name === 'f.txt' && e.entry) resolve(e)
    }, { includeEntry: true, allowNetworkMounts: true })
    await sbx.files.write(`watched-${run}/f.txt`, 'hello')
    const ev = await seen
    assert.equal(ev.entry.path, `/home/user/watched-${run}/f.txt`)
    assert.equal(ev.entry.type, 'file')
    assert.equal(ev.entry.owner, 'user')
    await w.stop()
  })
})

test('files: signed upload and download URLs of a secure sandbox', async () => {
  // 2.51 sends no secure option: the sandbox is made through the API, as
  // 2.50 makes it, and connected to.
  const made = await api('POST', '/sandboxes', { templateID: 'base', timeout: 120, secure: true })
  assert.equal(made.status, 201, made.text)
  assert.match(made.json.envdAccessToken, /^[0-9a-f]{64}$/)
  const sbx = await Sandbox.connect(made.json.sandboxID)
  try {
    const path = `/tmp/signed-${run}.txt`
    const up = await sbx.uploadUrl(path, { useSignatureExpiration: 60 })
    const form = new FormData()
    form.append('file', new Blob(['signed!']), path)
    const res = await fetch(up, { method: 'POST', body: form, headers: envdRouting(sbx) })
    assert.equal(res.status, 200, await res.text())
    const down = await sbx.downloadUrl(path)
    const got = await fetch(down, { headers: envdRouting(sbx) })
    assert.equal(got.status, 200)
    assert.equal(await got.text(), 'signed!')
    // As a browser or curl fetches them, with nothing naming the sandbox:
    // the proxy finds it by the signature.
    const plain = await fetch(down)
    assert.equal(plain.status, 200)
    assert.equal(await plain.text(), 'signed!')
    const other = `${path}.plain`
    const form2 = new FormData()
    form2.append('file', new Blob(['plain!']), other)
    assert.equal((await fetch(await sbx.uploadUrl(other), { method: 'POST', body: form2 })).status, 200)
    assert.equal(await (await fetch(await sbx.downloadUrl(other))).text(), 'plain!')
    const forged = new URL(down)
    forged.searchParams.set('signature', 'v1_forged')
    assert.equal((await fetch(forged)).status, 401)
    // An expired one, in E2B envd's words.
    const expired = await fetch(await sbx.downloadUrl(path, { useSignatureExpiration: -10 }))
    assert.equal(expired.status, 401)
    assert.deepEqual(await expired.json(), { code: 401, message: 'signature is already expired' })
    const bad = new URL(down)
    bad.searchParams.set('signature', 'v1_forged')
    assert.equal((await fetch(bad, { headers: envdRouting(sbx) })).status, 401)
    const unsigned = new URL(down)
    unsigned.searchParams.delete('signature')
    assert.equal((await fetch(unsigned, { headers: envdRouting(sbx) })).status, 401)
    // The SDK itself uses the access token; without it envd refuses.
    assert.equal(await sbx.files.read(path), 'signed!')
    const noToken = await fetch(new URL('/health', down), { headers: envdRouting(sbx) })
    assert.equal(noToken.status, 204)
    const list = await fetch(new URL('/process.Process/List', down), {
      method: 'POST', body: '{}', headers: { ...envdRouting(sbx), 'Content-Type': 'application/json' },
    })
    assert.equal(list.status, 401)
  } finally {
    await sbx.kill()
  }
})

// envdRouting is what the SDK adds to envd requests when E2B_SANDBOX_URL
// routes by header rather than by host.
function envdRouting(sbx) {
  return { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }
}
