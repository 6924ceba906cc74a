// Shared set-up for the E2B SDK tests. The Go harness (e2b_test.go) starts
// lizard serve and runs these files once per E2B SDK version: E2B_SDK names
// the package (an npm alias of `e2b`), E2B_API_URL, E2B_API_KEY and
// E2B_SANDBOX_URL are set as a user would set them.
import http from 'node:http'
import { budget } from '../budget.mjs'

export const sdk = await import(process.env.E2B_SDK)
export const { Sandbox } = sdk
export const apiUrl = process.env.E2B_API_URL
export const apiKey = process.env.E2B_API_KEY
export const proxyUrl = new URL(process.env.E2B_SANDBOX_URL)

// withSandbox runs fn with a fresh sandbox and always kills it.
export async function withSandbox(fn, opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: budget(120_000), ...opts })
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill()
  }
}

// api calls the E2B REST API directly, for what the SDK does not send.
export async function api(method, path, body, key = apiKey) {
  const headers = { 'Content-Type': 'application/json' }
  if (key) headers['X-API-Key'] = key
  const res = await fetch(apiUrl + path, { method, headers, body: typeof body === 'string' ? body : body && JSON.stringify(body) })
  const text = await res.text()
  let json
  try { json = JSON.parse(text) } catch { json = undefined }
  return { status: res.status, json, text }
}

// sh runs a shell command in the sandbox through the Lizard API (same key,
// same project), independent of envd.
export async function sh(id, cmd) {
  const res = await fetch(`${apiUrl}/api/sandboxes/${id}/exec`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-API-Key': apiKey },
    body: JSON.stringify({ cmd, timeout: 60 }),
  })
  const out = await res.json()
  if (res.status !== 200 || out.exitCode !== 0) throw new Error(`exec ${cmd}: ${res.status} ${JSON.stringify(out)}`)
  return out
}

// startServer runs an HTTP server on port (of bind, default every
// address) in the sandbox and waits for it.
export async function startServer(id, port, bind = '0.0.0.0') {
  await sh(id, `mkdir -p /tmp/www && echo hello-from-${id} > /tmp/www/index.html && cd /tmp/www && (nohup python3 -m http.server --bind ${bind} ${port} > /tmp/http.log 2>&1 &) ; for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:${port}/ && exit 0; sleep 0.05; done; cat /tmp/http.log; exit 1`)
}

// get sends GET / to host (as sbx.getHost(port) gives it) through the
// proxy: *.localhost names do not resolve in node, so the proxy's address
// is dialled with the host in the Host header, as DNS would have it.
export function get(host, headers = {}, path = '/') {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: proxyUrl.hostname, port: proxyUrl.port, path, headers: { Host: host, ...headers } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
