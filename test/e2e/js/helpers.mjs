// Shared set-up for the SDK end-to-end tests. The Go harness (e2e_test.go)
// starts lizard serve and passes LIZARD_API_URL and LIZARD_API_KEY.
import { Lizard } from '@lizard-build/sdk'

export const lizard = new Lizard({ project: 'default' })

// withSandbox runs fn with a fresh base sandbox and always kills it.
export async function withSandbox(fn, opts = {}) {
  const sandbox = await lizard.create('base', { timeoutMs: 120_000, ...opts })
  try {
    return await fn(sandbox)
  } finally {
    await sandbox.kill()
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
