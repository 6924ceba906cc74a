// The egress proxy through the unmodified e2b SDK (2.50 and 2.51: the Go
// harness, egressproxy_test.go, runs this file once per version) against
// the test's fake internet (egressnet_test.go): names decided on the wire,
// transforms with a secret or a literal, splices, denyOut with allowOut,
// updateNetwork, egressProxy, httpsPorts.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { createPublicKey, verify } from 'node:crypto'
import { budget } from '../budget.mjs'
import { sdk, Sandbox, get, sleep } from '../e2b/helpers.mjs'

const { Secret, CommandExitError } = sdk
const ALL = '0.0.0.0/0'
const web = process.env.EGRESS_WEB // allowed.test, rules.test, denied.test, other.test
const far = process.env.EGRESS_FAR
const near = process.env.EGRESS_NEAR
const netRange = process.env.EGRESS_NET
const testCA = readFileSync(process.env.EGRESS_CA, 'utf8')
const run = Math.random().toString(36).slice(2, 8)
console.log(`egress tests: run ${run}, sdk ${process.env.E2B_SDK}`)

// withSandbox runs fn with a fresh sandbox holding the test CA at
// /tmp/testca.pem (for spliced connections, which the upstream's own
// certificate answers) and always kills it.
async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create({ timeoutMs: budget(300_000), ...opts })
  try {
    await sbx.files.write('/tmp/testca.pem', testCA)
    return await fn(sbx)
  } finally {
    await sbx.kill()
  }
}

// sh runs cmd and returns its result whatever its exit status.
async function sh(sbx, cmd) {
  try {
    return await sbx.commands.run(cmd, { timeoutMs: budget(60_000) })
  } catch (err) {
    if (err instanceof CommandExitError) return err
    throw err
  }
}

const curl = 'curl -sS -m 10'

// reach runs curl and returns the echo's JSON, or null when the request
// did not get through (curl failed: refused, reset, a TLS alert, the
// proxy's 403).
async function reach(sbx, args) {
  const r = await sh(sbx, `${curl} -f ${args}`)
  if (r.exitCode !== 0) {
    console.log(`  curl ${args}: exit ${r.exitCode} ${r.stderr.trim()}`)
    return null
  }
  return JSON.parse(r.stdout)
}

// seen asks the fake internet whether a request for path reached it.
async function seen(path) {
  const res = await fetch(`http://${web}/seen?path=${encodeURIComponent(path)}`)
  return res.json()
}

// notInSandbox checks that no process, file, environment or /proc entry
// of the sandbox holds value. The pattern is a regular expression that
// matches value but is not it, so the search does not find itself.
async function notInSandbox(sbx, value) {
  const pattern = value.slice(0, -1) + '[' + value.slice(-1) + ']'
  const r = await sh(sbx, `grep -rlsa --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e '${pattern}' / ; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -ca -e '${pattern}'`)
  assert.equal(r.stdout.trim(), '0', `the value is in the sandbox: ${r.stdout}`)
}

test('a transform injects a header; the sandbox never holds its value', async () => {
  const literal = `literal-${run}-value`
  await withSandbox({
    network: {
      allowOut: ['rules.test', 'allowed.test'], denyOut: [ALL],
      rules: { 'rules.test': [{ transform: { headers: { 'X-Api-Key': literal } } }] },
    },
  }, async (sbx) => {
    const got = await reach(sbx, `https://rules.test/probe/${run}-literal`)
    assert.equal(got.headers['X-Api-Key'], literal)
    assert.equal(got.host, 'rules.test')
    await notInSandbox(sbx, literal)
    const info = await sbx.getInfo()
    assert.deepEqual(info.network.rules['rules.test'], [{ transform: { headers: { 'X-Api-Key': literal } } }])
    assert.deepEqual(info.network.allowOut, ['rules.test', 'allowed.test'])
    assert.deepEqual(info.network.denyOut, [ALL])
  })
})

test('a transform injects ${e2b.secrets.NAME}: updated values, a destroyed secret is a 502', async () => {
  const name = `tok-${run}`
  const value = `s3cr3t-${run}-first`
  await Secret.create(name, value)
  try {
    await withSandbox({
      network: {
        allowOut: ['rules.test'], denyOut: [ALL],
        rules: { 'rules.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] },
      },
    }, async (sbx) => {
      let got = await reach(sbx, `https://rules.test/probe/${run}-secret-1`)
      assert.equal(got.headers.Authorization, `Bearer ${value}`)
      await notInSandbox(sbx, value)
      const info = await sbx.getInfo()
      assert.equal(info.network.rules['rules.test'][0].transform.headers.Authorization, `Bearer \${e2b.secrets.${name}}`)
      // The next request uses the secret's new value.
      await Secret.update(name, `s3cr3t-${run}-second`)
      got = await reach(sbx, `https://rules.test/probe/${run}-secret-2`)
      assert.equal(got.headers.Authorization, `Bearer s3cr3t-${run}-second`)
      // Destroyed: a 502 naming it, and nothing sent.
      await Secret.destroy(name)
      const path = `/probe/${run}-secret-3`
      const r = await sh(sbx, `${curl} -w '\\n%{http_code}' https://rules.test${path}`)
      assert.match(r.stdout, new RegExp(`secret "${name}"[^\\n]*\\n+502$`))
      assert.equal((await seen(path)).seen, false)
    })
  } finally {
    await Secret.destroy(name).catch(() => {})
  }
})

// b64url decodes a JWT part.
const b64url = (part) => Buffer.from(part.replace(/-/g, '+').replace(/_/g, '/'), 'base64')

test('a transform injects ${e2b.identity.tokens.NAME}: a fresh JWT of the sandbox that the issuer\'s key set verifies', async () => {
  const audience = `aud-${run}.test`
  await withSandbox({
    iam: { tokens: { cloud: Secret.iamToken({ audience, tokenType: 'JWT-SVID' }) } },
    network: {
      allowOut: ['rules.test'], denyOut: [ALL],
      rules: { 'rules.test': [{ transform: { headers: { Authorization: 'Bearer ${e2b.identity.tokens.cloud}' } } }] },
    },
  }, async (sbx) => {
    const first = await reach(sbx, `https://rules.test/probe/${run}-token-1`)
    const second = await reach(sbx, `https://rules.test/probe/${run}-token-2`)
    const jwt = first.headers.Authorization.replace(/^Bearer /, '')
    assert.notEqual(jwt, second.headers.Authorization.replace(/^Bearer /, ''), 'a token is minted per request')
    const [h, p, sig] = jwt.split('.')
    const header = JSON.parse(b64url(h)), claims = JSON.parse(b64url(p))
    assert.equal(claims.aud, audience)
    assert.match(claims.sub, new RegExp(`/sandbox/${sbx.sandboxId}$`))
    assert.equal(claims.sandbox_id, sbx.sandboxId)
    assert.ok(claims.exp - claims.iat <= 3600 && claims.exp > Date.now() / 1000, `a short-lived token: ${JSON.stringify(claims)}`)
    // The issuer's key set (its discovery document names it) verifies it.
    const disco = await (await fetch(`${process.env.E2B_API_URL}/.well-known/openid-configuration`)).json()
    const jwks = await (await fetch(disco.jwks_uri)).json()
    const jwk = jwks.keys.find((k) => k.kid === header.kid)
    assert.ok(jwk, `kid ${header.kid} in the key set`)
    const key = createPublicKey({ key: jwk, format: 'jwk' })
    assert.ok(verify('RSA-SHA256', Buffer.from(`${h}.${p}`), key, b64url(sig)), 'the signature verifies')
    assert.ok(!verify('RSA-SHA256', Buffer.from(`${h}.${p}x`), key, b64url(sig)), 'a changed token does not')
    // Nothing in the sandbox holds the token.
    await notInSandbox(sbx, sig)
  })
})

test('an allowed name without rules is spliced: the sandbox sees the upstream certificate', async () => {
  await withSandbox({ network: { allowOut: ['allowed.test'], denyOut: [ALL] } }, async (sbx) => {
    const got = await reach(sbx, '--cacert /tmp/testca.pem https://allowed.test/')
    assert.equal(got.host, 'allowed.test')
    const r = await sh(sbx, 'openssl s_client -connect allowed.test:443 -servername allowed.test </dev/null 2>/dev/null | openssl x509 -noout -issuer')
    assert.match(r.stdout, /egress e2e CA/)
    // Not the node's CA: the system trust store does not know the test's.
    assert.equal(await reach(sbx, 'https://allowed.test/'), null)
  })
})

test('a denied name on an allowed address is refused by SNI and by Host; a denied address is refused', async () => {
  await withSandbox({ network: { allowOut: ['allowed.test'], denyOut: [ALL] } }, async (sbx) => {
    assert.equal(await reach(sbx, `--cacert /tmp/testca.pem --resolve denied.test:443:${web} https://denied.test/`), null)
    const r = await sh(sbx, `${curl} -i --resolve denied.test:80:${web} http://denied.test/`)
    assert.match(r.stdout, /^HTTP\/1\.1 403/)
    assert.match(r.stdout, /"denied\.test" is not allowed/)
    assert.equal((await reach(sbx, 'http://allowed.test/')).host, 'allowed.test')
    // One connection, two Hosts: the second is refused.
    const two = await sh(sbx, `${curl} -o /dev/null -o /dev/null -w '%{http_code} ' --resolve allowed.test:80:${web} --resolve denied.test:80:${web} http://allowed.test/ http://denied.test/`)
    assert.equal(two.stdout.trim(), '200 403')
    // An address, with no name that could allow it.
    assert.equal(await reach(sbx, `--cacert /tmp/testca.pem https://${far}/`), null)
    assert.equal(await reach(sbx, `http://${far}/`), null)
    // The log says so.
    const log = await fetchLog(sbx.sandboxId)
    assert.ok(log.some((e) => e.host === 'denied.test' && e.decision === 'denied'), JSON.stringify(log))
  })
})

// fetchLog reads the sandbox's egress log (the Lizard API's route, with
// the same key).
async function fetchLog(id) {
  const res = await fetch(`${process.env.E2B_API_URL}/api/sandboxes/${id}/network/log`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
  assert.equal(res.status, 200)
  return (await res.json()).entries
}

test('denyOut with allowOut: allowed entries win', async () => {
  await withSandbox({ network: { denyOut: [netRange], allowOut: [far] } }, async (sbx) => {
    assert.equal((await reach(sbx, `http://${far}/`)).addr, far)
    assert.equal(await reach(sbx, `http://${near}/`), null)
    assert.equal(await reach(sbx, `--cacert /tmp/testca.pem https://${near}/`), null)
  })
  // A name allowed on a denied range goes; its neighbours do not.
  await withSandbox({ network: { denyOut: [netRange], allowOut: ['allowed.test'] } }, async (sbx) => {
    assert.equal((await reach(sbx, '--cacert /tmp/testca.pem https://allowed.test/')).host, 'allowed.test')
    assert.equal(await reach(sbx, `--cacert /tmp/testca.pem --resolve other.test:443:${web} https://other.test/`), null)
  })
})

test('updateNetwork: from allow to deny and back, at once for new connections', async () => {
  await withSandbox({ network: { allowOut: ['allowed.test'], denyOut: [ALL] } }, async (sbx) => {
    const url = `--cacert /tmp/testca.pem --resolve allowed.test:443:${web} https://allowed.test/`
    assert.equal((await reach(sbx, url)).host, 'allowed.test')
    await sbx.updateNetwork({ denyOut: [ALL] })
    assert.equal(await reach(sbx, url), null)
    assert.deepEqual((await sbx.getInfo()).network.allowOut ?? [], [])
    await Sandbox.updateNetwork(sbx.sandboxId, { allowOut: ['allowed.test'], denyOut: [ALL] })
    assert.equal((await reach(sbx, url)).host, 'allowed.test')
    // Rules come and go with an update too.
    await sbx.updateNetwork({ allowOut: ['allowed.test'], denyOut: [ALL], rules: { 'allowed.test': [{ transform: { headers: { 'X-Now': 'on' } } }] } })
    assert.equal((await reach(sbx, 'https://allowed.test/')).headers['X-Now'], 'on')
    // Bad input: a 400 naming the field.
    await assert.rejects(sbx.updateNetwork({ denyOut: ['example.com'] }), /denyOut\[0\]/)
    await assert.rejects(sbx.updateNetwork({ allowOut: ['*'] }), /allowOut\[0\]/)
    await assert.rejects(sbx.updateNetwork({ rules: { 'a.test': [{ transform: { headers: { 'no good': 'x' } } }] } }), /not an HTTP token/)
    await assert.rejects(sbx.updateNetwork({ rules: { 'a.test': [{ transform: { headers: { X: `\${e2b.secrets.nosuch-${run}}` } } }] } }), /network\.rules/)
  })
})

test('egressProxy: allowed TCP goes through the SOCKS5 server, by name for names', async () => {
  const [host, port] = process.env.EGRESS_SOCKS.split(':')
  await withSandbox({
    network: {
      allowOut: ['allowed.test', far], denyOut: [ALL],
      egressProxy: { address: `${host}:${port}`, username: process.env.EGRESS_SOCKS_USER, password: process.env.EGRESS_SOCKS_PASS },
    },
  }, async (sbx) => {
    const before = (await (await fetch(`http://${web}/socks`)).json()).length
    assert.equal((await reach(sbx, `--cacert /tmp/testca.pem https://allowed.test/probe/${run}-socks`)).host, 'allowed.test')
    assert.equal((await reach(sbx, `http://${far}/`)).addr, far)
    const reqs = (await (await fetch(`http://${web}/socks`)).json()).slice(before)
    assert.ok(reqs.some((r) => r.Target === 'allowed.test:443' && r.ByName), JSON.stringify(reqs))
    assert.ok(reqs.some((r) => r.Target === `${far}:80` && !r.ByName), JSON.stringify(reqs))
    const info = await sbx.getInfo()
    assert.deepEqual(info.network.egressProxy, { address: `${host}:${port}`, username: process.env.EGRESS_SOCKS_USER })
    // Filtering first: a denied address never reaches the proxy.
    assert.equal(await reach(sbx, `http://${near}/`), null)
    const after = (await (await fetch(`http://${web}/socks`)).json()).slice(before)
    assert.ok(!after.some((r) => r.Target.startsWith(near)), JSON.stringify(after))
  })
})

test('httpsPorts: the proxy reaches a TLS server in the sandbox', async () => {
  await withSandbox({ network: { httpsPorts: [8443] } }, async (sbx) => {
    await sh(sbx, 'openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=sbx -keyout /tmp/k.pem -out /tmp/c.pem -days 1 2>/dev/null')
    await sbx.commands.run(`python3 -c "
import http.server, ssl
for port in (8443, 8444):
    import threading
    s = http.server.HTTPServer(('0.0.0.0', port), type('H', (http.server.BaseHTTPRequestHandler,), {'do_GET': lambda self: (self.send_response(200), self.end_headers(), self.wfile.write(b'hello over tls')), 'log_message': lambda *a: None}))
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain('/tmp/c.pem', '/tmp/k.pem')
    s.socket = c.wrap_socket(s.socket, server_side=True)
    threading.Thread(target=s.serve_forever).start()
"`, { background: true })
    await sh(sbx, 'for i in $(seq 1 100); do curl -sk -o /dev/null https://127.0.0.1:8444/ && exit 0; sleep 0.1; done; exit 1')
    let res
    for (let i = 0; i < 20; i++) {
      res = await get(sbx.getHost(8443))
      if (res.status === 200) break
      await sleep(250)
    }
    assert.equal(res.status, 200)
    assert.equal(res.body, 'hello over tls')
    // A TLS port not listed is spoken to in plain HTTP, which it refuses.
    assert.notEqual((await get(sbx.getHost(8444))).status, 200)
    assert.deepEqual((await sbx.getInfo()).network.httpsPorts, [8443])
  })
})

test('bad network input is a 400 naming the field', async () => {
  const bad = [
    [{ allowOut: ['*'] }, /allowOut\[0\]/],
    [{ denyOut: ['example.com'] }, /denyOut\[0\]/],
    [{ rules: { 'a.test': [{ transform: { headers: { 'x y': '1' } } }] } }, /not an HTTP token/],
    [{ rules: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`h${i}.test`, []])) }, /at most 64/],
    [{ rules: { 'a.test': [{ transform: { headers: { A: `\${e2b.secrets.nosuch-${run}}` } } }] } }, /network\.rules/],
  ]
  for (const [network, want] of bad) {
    await assert.rejects(Sandbox.create({ network, timeoutMs: 10_000 }), want)
  }
})
