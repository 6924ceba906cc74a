// Times the same work through E2B's JS SDKs (e2b, @e2b/code-interpreter,
// unchanged, pointed at lizard by E2B_API_URL, E2B_API_KEY and
// E2B_SANDBOX_URL) and through @lizard-build/sdk (LIZARD_API_URL,
// LIZARD_API_KEY): create → first command, a command, 1 MiB written and
// read back, runCode('1+1'). E2B runs commands in a login bash, lizard in
// sh: the same command in a login bash through lizard's SDK is a row too. Prints one JSON line of milliseconds per SDK
// and operation. The two SDKs take turns, so that neither gets a quieter
// machine.
import { Sandbox as E2BSandbox } from 'e2b'
import { Sandbox as E2BCodeSandbox } from '@e2b/code-interpreter'
import { Lizard, CodeSandbox } from '@lizard-build/sdk'

const n = Number(process.argv[2] ?? 10)
const mib = new Uint8Array(1 << 20).map((_, i) => (i * 7) & 0xff)
const out = { e2b: {}, lizard: {} }
const rec = (sdk, op, ms) => (out[sdk][op] ??= []).push(ms)
const time = async (fn) => { const t = performance.now(); await fn(); return performance.now() - t }
const must = (ok, what) => { if (!ok) throw new Error(what) }
const same = (a, b) => a.length === b.length && a.every((v, i) => v === b[i])

const sdks = {
  e2b: {
    create: () => E2BSandbox.create('base', { timeoutMs: 300_000 }),
    run: async (sb, cmd) => must((await sb.commands.run(cmd)).exitCode === 0, `e2b ${cmd}`),
    // E2B runs every command as /bin/bash -l -c.
    runLogin: async (sb, cmd) => must((await sb.commands.run(cmd)).exitCode === 0, `e2b ${cmd}`),
    write: (sb, p, b) => sb.files.write(p, b),
    read: async (sb, p) => new Uint8Array(await sb.files.read(p, { format: 'bytes' })),
    kill: (sb) => sb.kill(),
    code: () => E2BCodeSandbox.create({ timeoutMs: 300_000 }),
    runCode: async (sb) => must((await sb.runCode('1+1')).text === '2', 'e2b runCode'),
  },
  lizard: {
    create: () => new Lizard({ project: 'default' }).create('base', { timeoutMs: 300_000 }),
    run: async (sb, cmd) => must((await sb.process.exec(cmd)).exitCode === 0, `lizard ${cmd}`),
    runLogin: async (sb, cmd) => must((await sb.process.exec(['/bin/bash', '-l', '-c', cmd])).exitCode === 0, `lizard bash -l -c ${cmd}`),
    write: (sb, p, b) => sb.fs.write(p, b),
    read: async (sb, p) => new Uint8Array(await sb.fs.readBytes(p)),
    kill: (sb) => sb.kill(),
    code: () => CodeSandbox.create({ project: 'default', timeoutMs: 300_000 }),
    runCode: async (sb) => must((await sb.runCode('1+1')).results[0]?.data === '2', 'lizard runCode'),
  },
}

// One warm-up each (the first create of a template may make its ready
// state), not counted.
for (const s of Object.values(sdks)) {
  await s.kill(await s.create())
  const c = await s.code()
  await s.runCode(c)
  await s.kill(c)
}

const creates = Math.max(3, Math.ceil(n / 2))
for (let i = 0; i < creates; i++) {
  for (const [name, s] of Object.entries(sdks)) {
    let sb
    rec(name, 'create → first command', await time(async () => { sb = await s.create(); await s.run(sb, 'true') }))
    await s.kill(sb)
  }
}
const boxes = {}
for (const [name, s] of Object.entries(sdks)) boxes[name] = await s.create()
try {
  for (let i = 0; i < n * 2; i++) {
    for (const [name, s] of Object.entries(sdks)) rec(name, "commands.run('true')", await time(() => s.run(boxes[name], 'true')))
    for (const [name, s] of Object.entries(sdks)) rec(name, "'true' as E2B runs it (bash -l -c)", await time(() => s.runLogin(boxes[name], 'true')))
  }
  for (let i = 0; i < n; i++) {
    for (const [name, s] of Object.entries(sdks)) {
      rec(name, '1 MiB write + read', await time(async () => {
        await s.write(boxes[name], '/tmp/mib.bin', mib)
        must(same(await s.read(boxes[name], '/tmp/mib.bin'), mib), `${name} read back`)
      }))
    }
  }
} finally {
  for (const [name, s] of Object.entries(sdks)) await s.kill(boxes[name])
}
const codes = {}
for (const [name, s] of Object.entries(sdks)) codes[name] = await s.code()
try {
  for (let i = 0; i < n * 2; i++) {
    for (const [name, s] of Object.entries(sdks)) rec(name, "runCode('1+1')", await time(() => s.runCode(codes[name])))
  }
} finally {
  for (const [name, s] of Object.entries(sdks)) await s.kill(codes[name])
}
console.log(JSON.stringify(out))
