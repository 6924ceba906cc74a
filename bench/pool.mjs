// Times create → first exec through @lizard-build/sdk from the full pool of
// base (a warm copy is taken) and of a project without a pool
// (LIZARD_COLD_KEY: a cold create), taking turns, the pool full before
// each. Prints one JSON line of milliseconds: {"warm": [...], "cold": [...]}.
import { Lizard } from '@lizard-build/sdk'

const n = Number(process.argv[2] ?? 10)
const url = process.env.LIZARD_API_URL
const key = process.env.LIZARD_API_KEY
const warmClient = new Lizard({ project: 'default' })
const coldClient = new Lizard({ project: 'bench-cold', apiKey: process.env.LIZARD_COLD_KEY })

async function full() {
  for (const end = Date.now() + 300_000; Date.now() < end; await new Promise((r) => setTimeout(r, 20))) {
    const r = await fetch(url + '/api/template-pools', { headers: { 'X-API-Key': key } })
    const { pools } = await r.json()
    if (pools.length === 1 && pools[0].ready === pools[0].size && pools[0].leaving === 0) return
  }
  throw new Error('the pool did not fill')
}

async function once(client) {
  await full()
  const t = performance.now()
  const sb = await client.create('base', { timeoutMs: 300_000 })
  const r = await sb.process.exec('true')
  const ms = performance.now() - t
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
  await sb.kill()
  return ms
}

const out = { warm: [], cold: [] }
await once(warmClient) // warm-up, not counted
await once(coldClient)
for (let i = 0; i < n; i++) {
  out.cold.push(await once(coldClient))
  out.warm.push(await once(warmClient))
}
console.log(JSON.stringify(out))
