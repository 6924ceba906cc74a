// E2B's Secret API against lizard (the server runs with a secrets key):
// create, list in pages, get by name or id, update to a new version,
// destroy; no answer ever carries a value. The same through the Lizard
// API's /api/projects/{pid}/secrets. Workload tokens registered through
// Sandbox.create's iam (the server is an OIDC issuer here).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { sdk, Sandbox, api, apiUrl, apiKey } from './helpers.mjs'
import { budget } from '../budget.mjs'

const { Secret } = sdk
// Each SDK version's run has names of its own (one server runs both).
const prefix = `${process.env.E2B_SDK}-s`.toLowerCase()
const value = (i) => `value-${process.env.E2B_SDK}-${i}-7f3a9c`

// raw calls the API and returns the body as text, to look for values in it.
async function raw(method, path, body) {
  const res = await fetch(apiUrl + path, { method, headers: { 'X-API-Key': apiKey, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) })
  return { status: res.status, text: await res.text(), headers: res.headers }
}

test('Secret: create, list in pages, get, update, destroy; values never come back', async () => {
  const names = [4, 0, 3, 1, 2].map((i) => `${prefix}${i}`)
  const created = {}
  for (const [n, name] of names.entries()) {
    const info = await Secret.create(name, value(n), { metadata: { n: String(n) } })
    assert.equal(info.name, name)
    assert.equal(info.version, 1)
    assert.match(info.secretId, /^sec_/)
    assert.deepEqual(info.metadata, { n: String(n) })
    assert.ok(info.createdAt instanceof Date && !isNaN(info.createdAt))
    assert.ok(!JSON.stringify(info).includes(value(n)), 'create answered the value')
    created[name] = info
  }
  await assert.rejects(Secret.create(names[0], 'again'), (e) => e instanceof sdk.SecretError && !(e instanceof sdk.SecretNotFoundError))

  // Pages of two until the server gives no X-Next-Token.
  const paginator = Secret.list({ limit: 2 })
  const seen = []
  let pages = 0
  while (paginator.hasNext) {
    const items = await paginator.nextItems()
    assert.ok(items.length <= 2)
    pages++
    for (const s of items) {
      assert.equal(s.value, undefined)
      if (s.name.startsWith(prefix)) seen.push(s.name)
    }
  }
  assert.ok(pages >= 3, `${pages} pages of 2 for 5 secrets`)
  assert.deepEqual(seen, [...names].sort())

  const byName = await Secret.getInfo(names[1])
  const byId = await Secret.getInfo(created[names[1]].secretId)
  assert.equal(byName.secretId, byId.secretId)
  assert.equal(await Secret.exists(names[1]), true)
  assert.equal(await Secret.exists(`${prefix}-none`), false)
  await assert.rejects(Secret.getInfo(`${prefix}-none`), sdk.SecretNotFoundError)

  const updated = await Secret.update(names[1], 'a-new-value-for-1')
  assert.equal(updated.version, 2)
  assert.deepEqual(updated.metadata, { n: '1' })
  assert.ok(updated.updatedAt >= byName.updatedAt)
  await assert.rejects(Secret.update(`${prefix}-none`, 'x'), sdk.SecretNotFoundError)

  // Nothing a read answers holds a value.
  for (const path of ['/secrets?limit=100', `/secrets/${names[1]}`, `/secrets/${created[names[0]].secretId}`]) {
    const res = await raw('GET', path)
    assert.equal(res.status, 200, res.text)
    for (let n = 0; n < names.length; n++) assert.ok(!res.text.includes(value(n)), `${path} answered a value`)
    assert.ok(!res.text.includes('a-new-value-for-1'))
  }

  // A value with a line break cannot become a header: 400 naming it, not
  // echoing it.
  const bad = await raw('POST', '/secrets', { name: `${prefix}-bad`, value: 'evil\r\nX-Injected: 1' })
  assert.equal(bad.status, 400, bad.text)
  assert.match(bad.text, /value/)
  assert.ok(!bad.text.includes('X-Injected'))

  for (const name of names) assert.equal(await Secret.destroy(name), true)
  assert.equal(await Secret.destroy(names[0]), false)
  assert.equal(await Secret.exists(names[0]), false)
})

test('the Lizard API: /api/projects/{pid}/secrets, the same secrets', async () => {
  const name = `${prefix}-lz`
  const res = await raw('POST', '/api/projects/default/secrets', { name, value: value(9), metadata: { via: 'lizard' } })
  assert.equal(res.status, 201, res.text)
  const made = JSON.parse(res.text)
  assert.equal(made.version, 1)
  assert.ok(!res.text.includes(value(9)))
  // E2B's API sees it.
  const info = await Secret.getInfo(name)
  assert.equal(info.secretId, made.id)
  const patched = await raw('PATCH', `/api/projects/default/secrets/${made.id}`, { value: 'v2' })
  assert.equal(patched.status, 200, patched.text)
  assert.equal(JSON.parse(patched.text).version, 2)
  const list = await raw('GET', '/api/projects/default/secrets?limit=1')
  assert.equal(list.status, 200, list.text)
  assert.equal(JSON.parse(list.text).length, 1)
  assert.ok(list.headers.get('x-next-token') || (await raw('GET', '/api/projects/default/secrets')).text.includes(name))
  assert.equal((await raw('GET', '/api/projects/other-project/secrets')).status, 404)
  assert.equal((await raw('DELETE', `/api/projects/default/secrets/${name}`)).status, 204)
  assert.equal((await raw('GET', `/api/projects/default/secrets/${name}`)).status, 404)
})

test('iam: workload tokens registered at create are listed and minted', async () => {
  const sbx = await Sandbox.create({
    timeoutMs: budget(120_000),
    iam: { tokens: { aws: Secret.iamToken({ audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID' }) } },
  })
  try {
    const listed = await api('GET', `/api/sandboxes/${sbx.sandboxId}/iam/tokens`)
    assert.equal(listed.status, 200, listed.text)
    assert.deepEqual(listed.json, [{ name: 'aws', audience: 'sts.amazonaws.com', tokenType: 'JWT-SVID', lifetime: 300 }])
    const minted = await api('POST', `/api/sandboxes/${sbx.sandboxId}/iam/tokens/aws`)
    assert.equal(minted.status, 201, minted.text)
    const claims = JSON.parse(Buffer.from(minted.json.token.split('.')[1], 'base64url'))
    assert.equal(claims.aud, 'sts.amazonaws.com')
    assert.equal(claims.sandbox_id, sbx.sandboxId)
    assert.ok(claims.sub.endsWith(`/sandbox/${sbx.sandboxId}`), claims.sub)
    assert.equal(claims.exp - claims.iat, 300)
    const unknown = await api('POST', `/api/sandboxes/${sbx.sandboxId}/iam/tokens/gcp`)
    assert.equal(unknown.status, 404, unknown.text)
  } finally {
    await sbx.kill()
  }
  // A bad definition is refused before any sandbox is made.
  const res = await api('POST', '/v2/sandboxes', { templateID: 'base', iam: { tokens: { aws: { audience: 'x', tokenType: 'JWT' } } } })
  assert.equal(res.status, 400, res.text)
  assert.match(res.json.message, /iam\.tokens\.aws\.tokenType/)
})
