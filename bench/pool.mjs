// Times create → first exec through @lizard-build/sdk with the pool of base
// full (a warm copy is taken) and emptied (a cold create), taking turns.
// Prints one JSON line of milliseconds: {"warm": [...], "cold": [...]}.
import { Lizard } from '@lizard-build/sdk'

const n = Number(process.argv[2] ?? 10)
const url = process.env.LIZARD_API_URL
const key = process.env.LIZARD_API_KEY
const lizard = new Lizard({ project: 'default' })
const size = 2

async function api(method, path, body) {
  const r = await fetch(url + path, { method, headers: { 'X-API-Key': key, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) })
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`)
  return r.json()
}

async function pool(want) {
  await api('PUT', '/api/template-pools/base', { size: want })
  for (const end = Date.now() + 300_000; Date.now() < end; await new Promise((r) => setTimeout(r, 20))) {
    const { pools } = await api('GET', '/api/template-pools')
    if ((want === 0 && pools.length === 0) || (pools.length === 1 && pools[0].ready === want)) return
  }
  throw new Error(`the pool did not hold ${want}`)
}

async function once() {
  const t = performance.now()
  const sb = await lizard.create('base', { timeoutMs: 300_000 })
  const r = await sb.process.exec('true')
  const ms = performance.now() - t
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
  await sb.kill()
  return ms
}

const out = { warm: [], cold: [] }
await once() // warm-up, not counted
for (let i = 0; i < n; i++) {
  await pool(size)
  out.warm.push(await once())
  await pool(0)
  out.cold.push(await once())
}
console.log(JSON.stringify(out))
