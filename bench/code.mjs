// Times the SDK's CodeSandbox on the interpreter template against the bench's
// server (LIZARD_API_URL, LIZARD_API_KEY): create → first runCode, and the
// runCode('1+1') round trip. Prints one JSON line of milliseconds.
import { CodeSandbox } from '@lizard-build/sdk'

const n = Number(process.argv[2] ?? 10)
const created = []
const roundTrips = []
for (let i = 0; i < Math.max(2, Math.ceil(n / 4)); i++) {
  const t0 = performance.now()
  const sb = await CodeSandbox.create({ project: 'default', timeoutMs: 300_000 })
  try {
    const first = await sb.runCode('1+1')
    if (first.error || first.results[0]?.data !== '2') throw new Error(`first runCode: ${JSON.stringify(first)}`)
    created.push(performance.now() - t0)
    if (i === 0) {
      for (let j = 0; j < n; j++) {
        const t = performance.now()
        const r = await sb.runCode('1+1')
        if (r.results[0]?.data !== '2') throw new Error('runCode')
        roundTrips.push(performance.now() - t)
      }
    }
  } finally {
    await sb.kill()
  }
}
console.log(JSON.stringify({ created, roundTrips }))
