// A person opening a preview URL in a real browser: Debian's Chromium,
// headless, driven by playwright-core. *.localhost resolves to loopback in
// Chromium, so the preview hostname reaches the proxy with no DNS set-up.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { chromium } from 'playwright-core'
import { budget, chromiumArgs, withSandbox } from './helpers.mjs'

const CHROMIUM = '/usr/bin/chromium'

test('a preview URL in headless Chromium: page, reload by cookie, WebSocket, 401 without token', async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: make deps installs Debian's chromium`)
  await withSandbox(async (sb) => {
    await sb.fs.write('/tmp/app.py', await readFile(new URL('../testdata/app.py', import.meta.url), 'utf8'))
    const start = await sb.process.exec('nohup python3 /tmp/app.py 8000 > /tmp/app.log 2>&1 & for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.05; done; exit 1')
    assert.equal(start.exitCode, 0)
    const { url, hostname } = await sb.exposePort(8000)
    const browserUrl = url.replace('/?', '/browser?')

    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: chromiumArgs(),
    })
    try {
      const page = await (await browser.newContext()).newPage()
      const first = await page.goto(browserUrl)
      assert.equal(first.status(), 200)
      assert.equal(new URL(page.url()).searchParams.get('lizard_token'), null, 'the token is gone from the address bar')
      assert.equal(await page.textContent('#msg'), 'hello from the sandbox')
      await page.waitForFunction(() => document.getElementById('ws').textContent.startsWith('echo'), null, { timeout: budget(15_000) })
      assert.equal(await page.textContent('#ws'), 'echo: from the browser')

      const again = await page.reload()
      assert.equal(again.status(), 200, 'reload works by the cookie alone')
      assert.equal(await page.textContent('#msg'), 'hello from the sandbox')

      const stranger = await (await browser.newContext()).newPage()
      const denied = await stranger.goto(`http://${hostname}/browser`)
      assert.equal(denied.status(), 401)
    } finally {
      await browser.close()
    }
  })
})
