// What a create does with the fields @lizard-build/sdk 1.0.23 sends beside
// the template: region (the node's is answered), lizardToken (the CLI in
// the sandbox works with it), environment (only the default is known), and
// the caps on metadata.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { LizardError, AuthenticationError } from '@lizard-build/sdk'
import { lizard, withSandbox } from './helpers.mjs'

const key = process.env.LIZARD_API_KEY

// refusedFor asserts that a create was refused with a 400 naming field.
function refusedFor(field, text = field) {
  return (e) => {
    assert.ok(e instanceof LizardError, `${e}`)
    assert.equal(e.status, 400, `${e.message}`)
    assert.ok(e.message.includes(text), `${e.message} does not say ${text}`)
    return true
  }
}

test('region: the SDK asks us-east-1, the sandbox answers the node region', async () => {
  // The default client names us-east-1; the server is in its own region
  // (--region, default local) and runs the sandbox there all the same.
  await withSandbox(async (sb) => {
    const info = await sb.getInfo()
    assert.equal(info.region, 'local')
    const listed = (await lizard.list()).find((s) => s.sandboxId === sb.sandboxId)
    assert.equal(listed?.region, 'local')
  }, { environment: 'default' })
})

test('lizardToken: the lizard CLI in the sandbox lists its own sandbox', async () => {
  await withSandbox(async (sb) => {
    const env = await sb.process.exec('echo "$LIZARD_API_URL"; test "$LIZARD_API_KEY" = "$EXPECTED" && echo key-ok', { envs: { EXPECTED: key } })
    const [url, ok] = env.stdout.trim().split('\n')
    assert.match(url, /^http:\/\/10\.\d+\.\d+\.\d+:\d+$/, env.stdout)
    assert.equal(ok, 'key-ok')
    const ls = await sb.process.exec('lizard sandbox ls --json')
    assert.equal(ls.exitCode, 0, ls.stderr)
    assert.ok(JSON.parse(ls.stdout).some((s) => s.sandboxId === sb.sandboxId), ls.stdout)
    // The same with plain HTTP; only /api/ answers on this side.
    const one = await sb.process.exec(`curl -sS -H "X-API-Key: $LIZARD_API_KEY" "$LIZARD_API_URL/api/sandboxes/${sb.sandboxId}"`)
    assert.equal(JSON.parse(one.stdout).sandboxId, sb.sandboxId, one.stdout + one.stderr)
    const health = await sb.process.exec('curl -s -o /dev/null -w "%{http_code}" "$LIZARD_API_URL/healthz"')
    assert.equal(health.stdout, '404')
    // The key is given to the sandbox, not shown by the API.
    assert.ok(!JSON.stringify(await sb.getInfo()).includes(key))
    assert.ok(!JSON.stringify(await lizard.list()).includes(key))

    // A sandbox without a key cannot reach the API at all.
    await withSandbox(async (plain) => {
      const r = await plain.process.exec(`curl -sS -m 5 -o /dev/null "${url}/api/sandboxes"`)
      assert.notEqual(r.exitCode, 0, `a sandbox without lizardToken reached ${url}: ${r.stdout}`)
      assert.equal((await plain.process.exec('echo -n "$LIZARD_API_KEY"')).stdout, '')
    })
  }, { lizardToken: key })
})

test('lizardToken: an unknown key is refused, naming the field', async () => {
  await assert.rejects(lizard.create('base', { lizardToken: 'lz_not_a_key_of_this_server_000000' }), (e) => {
    assert.ok(!(e instanceof AuthenticationError), 'the caller is authenticated; the field is wrong')
    return refusedFor('lizardToken')(e)
  })
})

test('environment: only the default is known', async () => {
  await assert.rejects(lizard.create('base', { environment: 'staging' }), refusedFor('environment', 'environment "staging"'))
})

test('metadata: keys, key length and value length are capped', async () => {
  const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v']))
  await assert.rejects(lizard.create('base', { metadata: many }), refusedFor('metadata', 'metadata: 65 keys, at most 64'))
  await assert.rejects(lizard.create('base', { metadata: { ['k'.repeat(257)]: 'v' } }), refusedFor('metadata', 'at most 256'))
  await assert.rejects(lizard.create('base', { metadata: { big: 'v'.repeat(2049) } }), refusedFor('metadata', 'at most 2048'))
  await assert.rejects(lizard.create('base', { envs: { A: 'x'.repeat(70_000) } }), refusedFor('envs', 'at most 65536'))
  // At the caps it is a sandbox like any other.
  const full = Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`k${i}`, 'v'.repeat(2048)]))
  await withSandbox(async (sb) => {
    assert.deepEqual((await sb.getInfo()).metadata, full)
  }, { metadata: full })
})
