// A dashboard session that outlives --dashboard-session-ttl is refused: the
// page returns to the sign-in with the API's message, and the cookie no
// longer authenticates. Run by TestDashboardSessionExpiry with a short TTL.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { budget } from './budget.mjs'
import { BASE, browserContext, signIn } from './dashboard-helpers.mjs'

const KEY = process.env.LIZARD_API_KEY

test('an expired dashboard session is refused', async () => {
  const { ctx, close } = await browserContext()
  try {
    const page = await ctx.newPage()
    await signIn(page, KEY)
    await page.waitForSelector('#sandboxes')
    assert.equal(await page.evaluate(async () => (await fetch('/api/sandboxes')).status), 200)
    const cookie = (await ctx.cookies()).find((c) => c.name === 'lizard_session')
    assert.ok(cookie && cookie.expires > 0, 'the cookie lasts as long as the session')
    // The table polls; once the session expires the next poll is refused.
    await page.waitForFunction(() => document.getElementById('login-msg')?.textContent.includes('expired'), null, { timeout: budget(30_000) })
    assert.equal(await page.evaluate(async () => (await fetch('/api/sandboxes')).status), 401)
    // The browser dropped the cookie; the server refuses it too.
    const r = await fetch(`${BASE}/api/sandboxes`, { headers: { Cookie: `lizard_session=${cookie.value}` } })
    assert.equal(r.status, 401)
    assert.equal((await r.json()).code, 'session_expired')
  } finally {
    await close()
  }
})
