// Preview URLs with the official SDK: exposePort, getHost, accessToken and
// unexpose. The proxy listens on 127.0.0.1 (LIZARD_TEST_PROXY); requests name
// the preview host in the Host header, as a browser resolving
// *.sandbox.localhost to loopback would.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { readFile } from 'node:fs/promises'
import { withSandbox } from './helpers.mjs'

const [proxyHost, proxyPort] = (process.env.LIZARD_TEST_PROXY ?? '127.0.0.1:8081').split(':')

function get(hostname, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: proxyHost, port: Number(proxyPort), path, headers: { host: hostname, ...headers } }, (res) => {
      let body = ''
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('exposePort, getHost, accessToken and unexpose', async () => {
  await withSandbox(async (sb) => {
    await sb.fs.write('/tmp/app.py', await readFile(new URL('../testdata/app.py', import.meta.url), 'utf8'))
    const start = await sb.process.exec('nohup python3 /tmp/app.py 3000 > /tmp/app.log 2>&1 & for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:3000/ && exit 0; sleep 0.05; done; exit 1')
    assert.equal(start.exitCode, 0, 'the app listens')

    const exposed = await sb.exposePort(3000)
    assert.equal(exposed.port, 3000)
    assert.ok(exposed.hostname.startsWith(`${sb.sandboxId}-3000.`), exposed.hostname)
    assert.equal(sb.accessToken, exposed.accessToken)
    assert.ok(new URL(exposed.url).searchParams.get('lizard_token') === exposed.accessToken)
    assert.equal(await sb.getHost(3000), exposed.hostname)

    const denied = await get(exposed.hostname, '/page')
    assert.equal(denied.status, 401)
    const ok = await get(exposed.hostname, '/page', { 'X-Lizard-Access-Token': sb.accessToken })
    assert.equal(ok.status, 200)
    assert.match(ok.body, /hello from the sandbox/)

    const viaQuery = await get(exposed.hostname, `/page?lizard_token=${exposed.accessToken}`)
    assert.equal(viaQuery.status, 302)
    const cookie = viaQuery.headers['set-cookie'][0].split(';')[0]
    const byCookie = await get(exposed.hostname, '/page', { cookie })
    assert.equal(byCookie.status, 200)

    await sb.unexpose(3000)
    const gone = await get(exposed.hostname, '/page', { 'X-Lizard-Access-Token': sb.accessToken })
    assert.equal(gone.status, 401)
  })
})
