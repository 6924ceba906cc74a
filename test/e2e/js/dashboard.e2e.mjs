// The dashboard in a real browser (Debian's Chromium, headless, driven by
// playwright-core) against a real lizard serve: sign in, a sandbox created
// from the form appears in the live table, a terminal, a file dropped on
// the file browser, an exposed port's preview, pause and resume from the
// buttons, the events page showing them, a key created and revoked, a wrong key refused, another
// project's sandbox never shown. Run by TestDashboard (dashboard_test.go),
// which passes the other project's sandbox in LIZARD_OTHER_SANDBOX; with
// LIZARD_SCREENSHOTS=DIR the main pages are saved there.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { join } from 'node:path'
import { Sandbox } from '@lizard-build/sdk'
import { BASE, browserContext, signIn } from './dashboard-helpers.mjs'

const KEY = process.env.LIZARD_API_KEY
const OTHER = process.env.LIZARD_OTHER_SANDBOX
const SHOTS = process.env.LIZARD_SCREENSHOTS

async function shot (page, name) {
  if (!SHOTS) return
  await page.evaluate(() => { for (const t of document.querySelectorAll('.toast')) t.remove() })
  await page.screenshot({ path: join(SHOTS, `dashboard-${name}.png`) })
}

// apiFrom calls the API from the page, as the page's own script would, with
// the session cookie; it answers the status and body.
function apiFrom (page, method, path, headers = {}) {
  return page.evaluate(async ([method, path, headers]) => {
    const r = await fetch(path, { method, headers })
    return { status: r.status, body: await r.text() }
  }, [method, path, headers])
}

test('the dashboard: sign in, sandboxes, terminal, files, preview, pause and resume, events, keys', async () => {
  assert.ok(OTHER, 'LIZARD_OTHER_SANDBOX: run through TestDashboard')
  const { ctx, close } = await browserContext()
  let id = null
  try {
    const page = await ctx.newPage()
    const pageErrors = []
    page.on('pageerror', (e) => pageErrors.push(e))

    // A wrong key is refused with the API's message.
    await signIn(page, 'lz_not_a_key_of_this_server_0123456789')
    // Any message first, then its text: a network failure is named, not
    // waited out.
    await page.waitForFunction(() => document.getElementById('login-msg').textContent !== '')
    assert.match(await page.textContent('#login-msg'), /invalid API key/)
    assert.equal(await page.isVisible('#sandboxes'), false)
    await shot(page, 'signin')

    await page.fill('#apikey', KEY)
    await page.click('#signin')
    await page.waitForSelector('#sandboxes')
    assert.match(await page.textContent('#project'), /default/)
    const cookies = await ctx.cookies()
    const session = cookies.find((c) => c.name === 'lizard_session')
    assert.ok(session && session.httpOnly && session.sameSite === 'Strict', `session cookie ${JSON.stringify(cookies)}`)
    assert.equal(await page.evaluate(() => document.cookie), '', 'the page cannot read the session cookie')

    // Create from the form; the row appears without a reload.
    await page.waitForFunction(() => document.querySelectorAll('#create-template option').length > 0)
    await page.selectOption('#create-template', 'base')
    await page.selectOption('#create-size', 'small')
    await page.fill('#create-timeout', '600')
    await page.fill('#create-metadata', 'owner=dashboard-e2e')
    await page.fill('#create-envs', 'GREETING=hi')
    await page.click('#create')
    const created = await page.waitForSelector('.toast.ok >> text=/Created /')
    id = (await created.textContent()).match(/Created (\S+)/)[1].replace(/×$/, '')
    await page.waitForSelector(`#sandbox-rows tr[data-id="${id}"]`)
    const row = await page.textContent(`#sandbox-rows tr[data-id="${id}"]`)
    assert.match(row, /base/)
    assert.match(row, /owner=dashboard-e2e/)
    assert.match(row, /running/)

    // Another project's sandbox is never listed, and is not found.
    await page.waitForTimeout(2000) // a few more polls of the table
    assert.equal(await page.$(`#sandbox-rows tr[data-id="${OTHER}"]`), null)
    assert.equal((await apiFrom(page, 'GET', `/api/sandboxes/${OTHER}`)).status, 404)
    await page.fill('#filter', 'owner=dashboard')
    await page.waitForFunction((id) => document.querySelectorAll('#sandbox-rows tr').length === 1 && document.querySelector(`#sandbox-rows tr[data-id="${id}"]`), id)
    await page.fill('#filter', '')
    await shot(page, 'sandboxes')

    // The list of 200 sandboxes: rendered in the page, timed (bench notes).
    const ms = await page.evaluate(() => {
      const now = Date.now()
      const rows = Array.from({ length: 200 }, (_, i) => ({
        sandboxId: 'sb_synthetic' + i, template: i % 2 ? 'python' : 'base', status: i % 7 ? 'running' : 'paused', size: 'small', cpus: 2, memoryMb: 4096,
        startedAt: new Date(now - i * 60000).toISOString(), endAt: new Date(now + 300000).toISOString(), timeoutMs: 300000, metadata: { i: String(i), team: 'x' }
      }))
      const tbody = document.getElementById('sandbox-rows')
      const t0 = performance.now()
      tbody.innerHTML = window.lizardDashboard.renderSandboxRows(rows)
      void document.body.offsetHeight // layout
      const t = performance.now() - t0
      return t
    })
    console.log(`render of 200 sandbox rows: ${ms.toFixed(1)} ms`)

    // One sandbox: the terminal.
    await page.click(`#sandbox-rows a[href="#/sandbox/${id}"]`)
    await page.waitForFunction(() => document.getElementById('terminal-status')?.textContent === 'connected')
    await page.click('#terminal')
    await page.keyboard.type('echo hello\n')
    await page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')].some((d) => d.textContent.trim() === 'hello'))
    await page.keyboard.type('printf "\\033[31mred\\033[0m $GREETING\\n"\n')
    await page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')].some((d) => d.textContent.trim() === 'red hi'))
    // Colours reach the page: the word is drawn in a foreground colour.
    assert.ok(await page.$('#terminal .xterm-rows span[class*="xterm-fg-"]'), 'coloured output has a colour class')
    // Resize: the pty follows the page's size.
    await page.setViewportSize({ width: 1000, height: 800 })
    await page.waitForTimeout(300)
    await page.keyboard.type('clear; stty size\n')
    const size = await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#terminal .xterm-rows > div')].map((d) => d.textContent.trim())
      return rows.find((r) => /^\d+ \d+$/.test(r))
    })
    const [rows, cols] = (await size.jsonValue()).split(' ').map(Number)
    assert.ok(rows > 5 && cols > 40 && cols < 140, `stty size after resize: ${rows} ${cols}`)
    await page.setViewportSize({ width: 1400, height: 900 })
    if (SHOTS) {
      await page.keyboard.type('clear; uname -sr; ls --color=always -F /; printf "\\033[1;32m%s\\033[0m\\n" "hello from the dashboard"\n')
      await page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')].some((d) => d.textContent.trim() === 'hello from the dashboard'))
      await shot(page, 'terminal')
    }

    // Files: drop a file on the browser, find it with the SDK.
    await page.click('button[data-tab="files"]')
    await page.waitForSelector('#files-list tr[data-name="tmp"]')
    await page.click('#files-list tr[data-name="tmp"] a')
    await page.waitForFunction(() => document.getElementById('files-path').textContent === '/tmp/')
    await page.evaluate(() => {
      const dt = new DataTransfer()
      dt.items.add(new File(['dropped by the dashboard\n'], 'dropped.txt', { type: 'text/plain' }))
      document.getElementById('files-drop').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }))
    })
    await page.waitForSelector('#files-list tr[data-name="dropped.txt"]')
    const sb = await Sandbox.connect(id)
    const list = await sb.fs.list('/tmp')
    assert.ok(list.some((e) => e.name === 'dropped.txt'), `fs.list(/tmp): ${JSON.stringify(list.map((e) => e.name))}`)
    assert.equal(await sb.fs.read('/tmp/dropped.txt'), 'dropped by the dashboard\n')
    // View and edit it.
    await page.click('#files-list tr[data-name="dropped.txt"] a')
    await page.waitForSelector('#files-editor')
    assert.equal(await page.inputValue('#files-editor'), 'dropped by the dashboard\n')
    await page.fill('#files-editor', 'edited in the dashboard\n')
    await page.click('#files-viewer button.primary')
    await page.waitForSelector('.toast.ok >> text=/Saved \\/tmp\\/dropped.txt/')
    assert.equal(await sb.fs.read('/tmp/dropped.txt'), 'edited in the dashboard\n')
    await shot(page, 'files')

    // An exposed port: its link opens the app's page.
    await sb.fs.write('/tmp/site/index.html', '<!doctype html><title>app</title><h1 id="app">served from the sandbox</h1>')
    const start = await sb.process.exec('cd /tmp/site && nohup python3 -m http.server 8000 > /tmp/http.log 2>&1 & for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.05; done; exit 1')
    assert.equal(start.exitCode, 0)
    await page.click('button[data-tab="ports"]')
    await page.fill('#expose-port', '8000')
    await page.click('#expose')
    const link = await page.waitForSelector('#ports a.preview-link')
    const [preview] = await Promise.all([ctx.waitForEvent('page'), link.click()])
    await preview.waitForSelector('#app')
    assert.equal(await preview.textContent('#app'), 'served from the sandbox')
    await preview.close()

    // Charts and logs.
    await page.click('button[data-tab="metrics"]')
    await page.waitForFunction(() => Number(document.querySelector('#tab-metrics p').textContent.match(/(\d+) samples/)?.[1]) >= 4, null, { timeout: 60_000 })
    await shot(page, 'metrics')
    await page.click('button[data-tab="logs"]')
    await page.waitForFunction(() => document.getElementById('logs').textContent.includes('echo hello') || document.getElementById('logs').childElementCount > 0)
    await shot(page, 'logs')

    // Pause and resume from the buttons.
    await page.click('#sandbox-info button[data-act="pause"]')
    await page.waitForFunction(() => document.getElementById('sandbox-status').textContent === 'paused', null, { timeout: 60_000 })
    assert.equal((await sb.getInfo()).status, 'paused')
    await page.click('#sandbox-info button[data-act="resume"]')
    await page.waitForFunction(() => document.getElementById('sandbox-status').textContent === 'running', null, { timeout: 60_000 })
    assert.equal((await sb.process.exec('cat /tmp/dropped.txt')).stdout, 'edited in the dashboard\n')

    // The events page: this sandbox's life, newest first, with its cause;
    // nothing of the other project's sandbox.
    await page.goto(BASE + '/#/events')
    const lifeOf = () => page.$$eval(`#event-rows tr[data-sandbox="${id}"]`, (rs) => rs.map((r) => r.dataset.type))
    await page.waitForFunction((sid) => document.querySelectorAll(`#event-rows tr[data-sandbox="${sid}"]`).length >= 3, id, { timeout: 30_000 })
    assert.deepEqual((await lifeOf()).slice(0, 3), ['sandbox.resumed', 'sandbox.paused', 'sandbox.created'])
    assert.equal(await page.$(`#event-rows tr[data-sandbox="${OTHER}"]`), null, 'another project\'s events are not shown')
    await shot(page, 'events')

    // Snapshots, volumes and templates pages show.
    await page.goto(BASE + '/#/templates')
    await page.waitForSelector('#app td:text-is("base")')
    await shot(page, 'templates')
    // An API refusal is shown as the API words it: a built-in template is
    // not the project's to delete.
    page.once('dialog', (d) => d.accept())
    await page.click('#app tr:has(td:text-is("base")) button.danger')
    const refusal = await page.waitForSelector('.toast:not(.ok)')
    const [status, code] = (await refusal.$eval('.code', (e) => e.textContent)).split(' ')
    assert.match(status, /^4\d\d$/)
    const direct = await apiFrom(page, 'DELETE', '/api/templates/base', { 'X-API-Key': KEY })
    assert.equal(String(direct.status), status)
    const body = JSON.parse(direct.body)
    assert.equal(body.code, code)
    assert.ok((await refusal.textContent()).includes(body.message), `toast ${await refusal.textContent()} vs ${body.message}`)
    await refusal.$eval('button', (b) => b.click())

    // API keys: create one (shown once), sign in with it elsewhere, revoke
    // it: its next call is refused and its session ends.
    await page.goto(BASE + '/#/keys')
    await page.click('#create-key')
    const secret = await (await page.waitForSelector('#new-key-secret')).textContent()
    assert.match(secret, /^lz_/)
    assert.equal((await apiFrom(page, 'GET', '/api/projects', { 'X-API-Key': secret })).status, 200)
    // The MCP configuration to paste into an agent, with the new key: it
    // works as it is.
    const stdio = JSON.parse(await page.textContent('#mcp-stdio')).mcpServers.lizard
    assert.deepEqual(stdio, { command: 'lizard', args: ['mcp'], env: { LIZARD_API_URL: BASE, LIZARD_API_KEY: secret } })
    const remote = JSON.parse(await page.textContent('#mcp-http')).mcpServers.lizard
    assert.deepEqual(remote, { type: 'http', url: `${BASE}/mcp`, headers: { Authorization: `Bearer ${secret}` } })
    assert.match(await page.textContent('#mcp-claude-code'), new RegExp(`--transport http lizard ${BASE}/mcp --header "Authorization: Bearer ${secret}"`))
    const init = await fetch(remote.url, {
      method: 'POST',
      headers: { ...remote.headers, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'e2e', version: '1' } } })
    })
    const initBody = await init.text()
    assert.equal(init.status, 200, initBody)
    assert.match(initBody, /"serverInfo":\{"name":"lizard"/)
    await shot(page, 'keys')
    // A second profile: a browser of someone else signed in with the key.
    const second = await browserContext()
    try {
      const p2 = await second.ctx.newPage()
      await signIn(p2, secret)
      await p2.waitForSelector('#sandboxes')
      const prefix = secret.slice(0, 10)
      page.once('dialog', (d) => d.accept())
      await page.click(`#app tr:has(td:text-is("${prefix}…")) button.danger`)
      await page.waitForSelector(`.toast.ok >> text=/Revoked ${prefix}/`)
      assert.equal((await apiFrom(page, 'GET', '/api/projects', { 'X-API-Key': secret })).status, 401)
      // The other browser's session ends at its next call (the table polls).
      await p2.waitForFunction(() => document.getElementById('login-msg')?.textContent.includes('revoked'))
      assert.equal((await apiFrom(p2, 'GET', '/api/sandboxes')).status, 401)
    } finally {
      await second.close()
    }

    // Kill from the table.
    await page.goto(BASE + '/#/sandboxes')
    page.once('dialog', (d) => d.accept())
    await page.click(`#sandbox-rows tr[data-id="${id}"] button[data-act="kill"]`)
    await page.waitForSelector(`#sandbox-rows tr[data-id="${id}"]`, { state: 'detached' })
    id = null

    // Sign out: the cookie no longer works.
    await page.click('#signout')
    await page.waitForSelector('#apikey')
    assert.equal((await apiFrom(page, 'GET', '/api/sandboxes')).status, 401)
    assert.deepEqual(pageErrors, [], 'no script errors')
  } finally {
    if (id) await fetch(`${BASE}/api/sandboxes/${id}`, { method: 'DELETE', headers: { 'X-API-Key': KEY } }).catch(() => {})
    await close()
  }
})
