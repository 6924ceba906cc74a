// Shared set-up for the SDK end-to-end tests. The Go harness (e2e_test.go)
// starts lizard serve and passes LIZARD_API_URL and LIZARD_API_KEY.
import { Lizard } from '@lizard-build/sdk'
import { budget } from './budget.mjs'

export { budget }

export const lizard = new Lizard({ project: 'default' })

// withSandbox runs fn with a fresh base sandbox and always kills it.
export async function withSandbox(fn, opts = {}) {
  const sandbox = await lizard.create('base', { timeoutMs: budget(120_000), ...opts })
  try {
    return await fn(sandbox)
  } finally {
    await sandbox.kill()
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// counter reads the pid and value of the e2e counter process (the Go
// harness's counterScript) in sandbox sb.
export async function counter(sb) {
  const r = await sb.process.exec('cat /tmp/counter')
  if (r.exitCode !== 0) throw new Error(`cat /tmp/counter: exit ${r.exitCode}: ${r.stderr}`)
  const [pid, n] = r.stdout.trim().split(' ').map(Number)
  return { pid, n }
}

// chromiumArgs are the flags the browser tests start Chromium with. Preview
// URLs name <sandbox>-<port>.sandbox.localhost, which Chromium resolves to
// loopback; when the server's proxy listens elsewhere (a cluster node in a
// network namespace of its own, LIZARD_TEST_PROXY), those names are mapped
// to its address.
export function chromiumArgs() {
  const args = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync']
  const host = (process.env.LIZARD_TEST_PROXY ?? '127.0.0.1:8081').split(':')[0]
  if (host !== '127.0.0.1' && host !== 'localhost') {
    args.push(`--host-resolver-rules=MAP *.sandbox.localhost ${host}`)
  }
  return args
}

// collectLogs follows sandbox sb's log (sb.logs(opts)) until until(lines)
// holds for the lines so far (parsed), or budget(20 s) passed.
export async function collectLogs(sb, opts, until) {
  const ac = new AbortController()
  const timer = setTimeout(() => ac.abort(), budget(20_000))
  const lines = []
  try {
    for await (const ev of sb.logs({ ...opts, signal: ac.signal })) {
      lines.push(JSON.parse(ev.data))
      if (until(lines)) break
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e
  } finally {
    clearTimeout(timer)
  }
  return lines
}
