// The dashboard's Network tab in a real browser (as js/dashboard.e2e.mjs):
// a sandbox's rules, with their placeholders, and its egress log. Run by
// TestEgressProxy (egressproxy_test.go), which passes the sandbox in
// LIZARD_EGRESS_SANDBOX after its requests were decided.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { browserContext, signIn, BASE } from '../dashboard-helpers.mjs'

const ID = process.env.LIZARD_EGRESS_SANDBOX

test('the Network tab shows the rules and the egress log', async () => {
  assert.ok(ID, 'LIZARD_EGRESS_SANDBOX: run through TestEgressProxy')
  const { ctx, close } = await browserContext()
  try {
    const page = await ctx.newPage()
    const pageErrors = []
    page.on('pageerror', (e) => pageErrors.push(e))
    await signIn(page, process.env.LIZARD_API_KEY)
    await page.waitForSelector('#sandboxes')
    await page.goto(`${BASE}/#/sandbox/${ID}`)
    await page.click('button[data-tab="network"]')
    await page.waitForSelector('#network-rules li')
    const rules = await page.textContent('#network-rules')
    assert.match(rules, /rules\.test → X-Lizard-Rule: v1/)
    const conf = await page.textContent('#network-config')
    assert.match(conf, /allowed\.test/)
    assert.match(conf, /0\.0\.0\.0\/0/)
    await page.waitForFunction(() => document.querySelectorAll('#egress-log tr').length >= 3)
    const log = await page.textContent('#egress-log')
    assert.match(log, /rules\.test/)
    assert.match(log, /intercepted/)
    assert.match(log, /denied\.test/)
    assert.match(log, /denied/)
    assert.deepEqual(pageErrors, [])
  } finally {
    await close()
  }
})
