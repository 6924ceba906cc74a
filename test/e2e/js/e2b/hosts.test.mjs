// getHost(port) and fetch of a server in the sandbox through the preview
// proxy in E2B's host order; traffic tokens; what answers 502.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox, withSandbox, startServer, get, api, apiUrl, apiKey, proxyUrl } from './helpers.mjs'

test('getHost(port) reaches a server in the sandbox; ports are public', async () => {
  await withSandbox(async (sbx) => {
    await startServer(sbx.sandboxId, 8000)
    const host = sbx.getHost(8000)
    assert.match(host, new RegExp(`^8000-${sbx.sandboxId}\\.`))
    const res = await get(host)
    assert.equal(res.status, 200, res.body)
    assert.equal(res.body.trim(), `hello-from-${sbx.sandboxId}`)
    // The same by the routing headers of E2B_SANDBOX_URL.
    const byHeader = await get('127.0.0.1', { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' })
    assert.equal(byHeader.status, 200)
    // A closed port and an unknown sandbox are 502s, as E2B answers.
    const closed = await get(sbx.getHost(8001))
    assert.equal(closed.status, 502)
    assert.equal(JSON.parse(closed.body).code, 502)
    const unknown = await get(host.replace(sbx.sandboxId, 'nosuchsandbox'))
    assert.equal(unknown.status, 502)
    // E2B's own words, which its SDK's tests match.
    assert.deepEqual(JSON.parse(unknown.body), { code: 502, sandboxId: 'nosuchsandbox', message: 'The sandbox was not found' })
    // Paused: 502, and traffic does not resume it.
    await sbx.pause()
    assert.equal((await get(host)).status, 502)
    assert.equal((await sbx.getInfo()).state, 'paused')
    await Sandbox.connect(sbx.sandboxId)
    assert.equal((await get(host)).status, 200)
  })
})

test('getHost(port) reaches a server bound to 127.0.0.1 only', async () => {
  await withSandbox(async (sbx) => {
    await startServer(sbx.sandboxId, 8002, '127.0.0.1')
    // Not at the sandbox's own address: only its loopback serves it.
    const direct = await sbx.commands.run(`curl -s -o /dev/null --max-time 5 http://$(hostname -I | cut -d' ' -f1):8002/`).catch((e) => e)
    assert.notEqual(direct.exitCode, 0)
    const res = await get(sbx.getHost(8002))
    assert.equal(res.status, 200, res.body)
    assert.equal(res.body.trim(), `hello-from-${sbx.sandboxId}`)
    // Nothing on the port at all is still E2B's 502.
    assert.equal((await get(sbx.getHost(8003))).status, 502)
  })
})

test('private traffic needs the traffic access token', async () => {
  await withSandbox(async (sbx) => {
    assert.ok(sbx.trafficAccessToken, 'no traffic access token')
    await startServer(sbx.sandboxId, 8000)
    const host = sbx.getHost(8000)
    assert.equal((await get(host)).status, 403)
    assert.equal((await get(host, { 'e2b-traffic-access-token': 'wrong' })).status, 403)
    assert.equal((await get(host, { 'e2b-traffic-access-token': sbx.trafficAccessToken })).status, 200)
  }, { network: { allowPublicTraffic: false } })
})

// post sends a POST through the proxy with only the routing headers given.
function post(headers, path, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: proxyUrl.hostname, port: proxyUrl.port, path, method: 'POST', headers }, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (c) => { text += c })
      res.on('end', () => resolve({ status: res.statusCode, text }))
    })
    req.on('error', reject)
    req.end(body)
  })
}

test('envd is secured by default: a bare request through the proxy runs nothing', async () => {
  // 2.51 sends no secure flag and 2.50 sends secure: true: either way the
  // sandbox gets an envd access token, as E2B's API secures every sandbox.
  await withSandbox(async (sbx) => {
    assert.match(sbx.envdAccessToken ?? '', /^[0-9a-f]{64}$/)
    // The request of the report: Process/Start with only the routing
    // headers, no API key and no token.
    // A Connect streaming request: one envelope (flags, length, JSON).
    const msg = Buffer.from(JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', 'echo pwned > /tmp/pwn'] } }))
    const envelope = Buffer.alloc(5)
    envelope.writeUInt32BE(msg.length, 1)
    const res = await post({
      'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983',
      'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1',
    }, '/process.Process/Start', Buffer.concat([envelope, msg]))
    assert.equal(res.status, 401, res.text)
    // A wrong token is refused too; the SDK's own (right) token works.
    const wrong = await post({ 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': 'x'.repeat(64), 'Content-Type': 'application/json' },
      '/filesystem.Filesystem/Stat', JSON.stringify({ path: '/tmp/pwn' }))
    assert.equal(wrong.status, 401, wrong.text)
    assert.equal(await sbx.files.exists('/tmp/pwn'), false)
    // Unsigned file URLs are refused; the SDK signs them.
    assert.equal((await get('127.0.0.1', { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }, '/files?path=/etc/hostname')).status, 401)
    await sbx.files.write('/tmp/signed.txt', 'ok')
    const url = new URL(await sbx.downloadUrl('/tmp/signed.txt'))
    assert.ok(url.searchParams.get('signature'), url.href)
  })
  const info = await api('POST', '/v2/sandboxes', { templateID: 'base', timeout: 60 })
  assert.equal(info.status, 201, info.text)
  try {
    assert.match(info.json.envdAccessToken, /^[0-9a-f]{64}$/)
    const got = await api('GET', `/sandboxes/${info.json.sandboxID}`)
    assert.equal(got.json.envdAccessToken, info.json.envdAccessToken)
  } finally {
    await api('DELETE', `/sandboxes/${info.json.sandboxID}`)
  }
})

test('secure: false still makes an unsecured sandbox (for 2.50 callers that ask)', async () => {
  const plain = await api('POST', '/v2/sandboxes', { templateID: 'base', secure: false, timeout: 60 })
  assert.equal(plain.status, 201, plain.text)
  try {
    assert.equal(plain.json.envdAccessToken, undefined)
    const sbx = await Sandbox.connect(plain.json.sandboxID)
    assert.equal((await sbx.commands.run('echo open')).stdout.trim(), 'open')
  } finally {
    await api('DELETE', `/sandboxes/${plain.json.sandboxID}`)
  }
})

test('sandboxes of the Lizard API stay private to E2B addressing', async () => {
  const res = await fetch(`${apiUrl}/api/sandboxes`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-API-Key': apiKey },
    body: JSON.stringify({ template: 'base', timeoutMs: 60_000 }),
  })
  const lz = await res.json()
  try {
    await startServer(lz.sandboxId, 8000)
    await fetch(`${apiUrl}/api/sandboxes/${lz.sandboxId}/expose/8000`, { method: 'POST', headers: { 'X-API-Key': apiKey } })
    assert.equal((await get(`8000-${lz.sandboxId}.sandbox.localhost`)).status, 502)
    assert.equal((await get('127.0.0.1', { 'E2b-Sandbox-Id': lz.sandboxId, 'E2b-Sandbox-Port': '8000' })).status, 502)
    // Nor does the E2B API show or touch it.
    assert.equal((await api('GET', `/sandboxes/${lz.sandboxId}`)).status, 404)
  } finally {
    await fetch(`${apiUrl}/api/sandboxes/${lz.sandboxId}`, { method: 'DELETE', headers: { 'X-API-Key': apiKey } })
  }
})

test('network.maskRequestHost is the Host the sandbox\'s server sees', async () => {
  await withSandbox(async (sbx) => {
    const server = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = self.headers.get("Host", "").encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
http.server.HTTPServer(("0.0.0.0", 8005), H).serve_forever()
`
    await sbx.files.write('/tmp/host.py', server)
    await sbx.commands.run('python3 /tmp/host.py', { background: true })
    await sbx.commands.run('for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:8005/ && exit 0; sleep 0.05; done; exit 1')
    const res = await get(sbx.getHost(8005))
    assert.equal(res.status, 200, res.body)
    assert.equal(res.body, 'localhost:8005')
  }, { network: { maskRequestHost: 'localhost:${PORT}' } })
  // A mask that is no host is a 400 naming the field.
  const bad = await api('POST', '/sandboxes', { templateID: 'base', network: { maskRequestHost: 'not a host' } })
  assert.equal(bad.status, 400)
  assert.match(bad.text, /network\.maskRequestHost/)
})
