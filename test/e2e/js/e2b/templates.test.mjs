// What E2B's SDK asks of templates and of the calls lizard does not serve:
// Template.exists() by the project's templates, a create without a
// template refused as E2B's API refuses it, and unsupported calls as
// readable errors rather than "not found".
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { sdk, Sandbox, api } from './helpers.mjs'

test('Template.exists: true for a built template, false for anything else', async () => {
  assert.equal(await sdk.Template.exists('base'), true)
  assert.equal(await sdk.Template.exists('no-such-template-of-this-project'), false)
  const listed = (await api('GET', '/templates')).json.map((t) => t.templateID)
  assert.equal(await sdk.Template.exists('code-interpreter-v1'), listed.includes('code-interpreter-v1'))
  const alias = await api('GET', '/templates/aliases/base')
  assert.equal(alias.status, 200, alias.text)
  assert.deepEqual(alias.json, { templateID: 'base', public: true })
})

test('a create without templateID is a 400 naming it', async () => {
  const res = await api('POST', '/v2/sandboxes', { timeout: 30 })
  assert.equal(res.status, 400, res.text)
  assert.equal(res.json.code, 400)
  assert.match(res.json.message, /templateID/)
})

test('calls lizard does not serve say so, and are not "not found"', async () => {
  // An MCP gateway is E2B's own service.
  const res = await api('POST', '/v2/sandboxes', { templateID: 'base', mcp: { github: {} } })
  assert.equal(res.status, 400, res.text)
  assert.match(res.json.message, /not supported by lizard/)
})
