// The desktop with the official SDK: sandbox.desktop on the desktop template
// (start, input with xdotool, screenshots), its noVNC pages through the
// preview proxy in real headless Chromium (Debian's, driven by
// playwright-core), the view-only page's own token and read-only VNC, stop
// and restart with the same URLs; and on a template without a desktop, the
// SDK's clear failures. Needs the desktop template built (make templates).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { existsSync } from 'node:fs'
import { inflateSync } from 'node:zlib'
import { chromium } from 'playwright-core'
import { budget, chromiumArgs, lizard, sleep } from './helpers.mjs'

const CHROMIUM = '/usr/bin/chromium'
const [proxyHost, proxyPort] = (process.env.LIZARD_TEST_PROXY ?? '127.0.0.1:8081').split(':')
const PAGE_PORT = 8000

// The page covers the screen with a text area and reports what it sees to
// the server it came from: python's http.server logs each request line,
// so /tmp/http.log is the page's event log.
const PAGE = `<!doctype html>
<html><head><meta charset="utf-8"><title>lizard desktop</title>
<style>
  html, body { margin: 0; height: 4000px; background: #fff; }
  #in { position: fixed; inset: 0; width: 100%; height: 100%; box-sizing: border-box;
        border: 0; outline: 0; resize: none; font: 64px monospace; color: #000; background: #fff; caret-color: transparent; }
</style></head>
<body><textarea id="in" spellcheck="false"></textarea>
<script>
  const log = (q) => fetch('/log?' + q).catch(() => {})
  addEventListener('mousedown', (e) => log('ev=down&x=' + e.clientX + '&y=' + e.clientY + '&b=' + e.button))
  addEventListener('mouseup', (e) => log('ev=up&x=' + e.clientX + '&y=' + e.clientY + '&b=' + e.button))
  addEventListener('wheel', (e) => log('ev=wheel&dy=' + Math.sign(e.deltaY)), { passive: true })
  addEventListener('keydown', (e) => log('ev=key&k=' + encodeURIComponent(e.key)))
  document.getElementById('in').addEventListener('input', (e) => log('ev=value&v=' + encodeURIComponent(e.target.value)))
  log('ev=loaded')
</script></body></html>
`

// events returns the page's reports so far, oldest first, as URLSearchParams.
async function events(sb) {
  const r = await sb.process.exec('cat /tmp/http.log')
  return [...r.stdout.matchAll(/"GET \/log\?(\S+) HTTP/g)].map((m) => new URLSearchParams(m[1]))
}

async function waitFor(what, fn, timeoutMs = 20_000) {
  const end = Date.now() + budget(timeoutMs)
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await sleep(200)
  }
}

// decodePng reads an 8-bit RGB or RGBA, non-interlaced PNG (what
// lizard-desktop writes) into its size and pixels.
function decodePng(bytes) {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  assert.deepEqual([...buf.subarray(0, 8)], [137, 80, 78, 71, 13, 10, 26, 10], 'PNG signature')
  let pos = 8
  let width, height, depth, type, interlace
  const idat = []
  while (pos < buf.length) {
    const len = buf.readUInt32BE(pos)
    const kind = buf.toString('latin1', pos + 4, pos + 8)
    const data = buf.subarray(pos + 8, pos + 8 + len)
    if (kind === 'IHDR') {
      width = data.readUInt32BE(0); height = data.readUInt32BE(4)
      depth = data[8]; type = data[9]; interlace = data[12]
    } else if (kind === 'IDAT') idat.push(data)
    else if (kind === 'IEND') break
    pos += 12 + len
  }
  assert.equal(depth, 8, 'bit depth'); assert.ok(type === 2 || type === 6, `colour type ${type}`); assert.equal(interlace, 0)
  const bpp = type === 2 ? 3 : 4
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * bpp
  const px = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    for (let i = 0; i < stride; i++) {
      const a = i >= bpp ? px[y * stride + i - bpp] : 0
      const b = y > 0 ? px[(y - 1) * stride + i] : 0
      const c = y > 0 && i >= bpp ? px[(y - 1) * stride + i - bpp] : 0
      let v = line[i]
      if (f === 1) v += a
      else if (f === 2) v += b
      else if (f === 3) v += (a + b) >> 1
      else if (f === 4) {
        const p = a + b - c; const pa = Math.abs(p - a); const pb = Math.abs(p - b); const pc = Math.abs(p - c)
        v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c
      }
      px[y * stride + i] = v & 0xff
    }
  }
  return { width, height, bpp, px }
}

// darkPixels counts the pixels of an image that are close to black.
function darkPixels({ width, height, bpp, px }) {
  let n = 0
  for (let i = 0; i < width * height; i++) {
    if (px[i * bpp] < 96 && px[i * bpp + 1] < 96 && px[i * bpp + 2] < 96) n++
  }
  return n
}

function proxyGet(hostname, path, headers = {}) {
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

// rfbPointer runs in a noVNC page: it opens its own WebSocket to the page's
// websockify (carrying the host's cookie), does the RFB 3.8 handshake with
// no authentication, and sends one pointer move to (x, y). It returns the
// framebuffer size the server announced.
async function rfbPointer([x, y]) {
  const ws = new WebSocket(`ws://${location.host}/websockify`, ['binary'])
  ws.binaryType = 'arraybuffer'
  let buf = new Uint8Array(0)
  let wake = () => {}
  ws.onmessage = (e) => {
    const b = new Uint8Array(e.data)
    const n = new Uint8Array(buf.length + b.length); n.set(buf); n.set(b, buf.length); buf = n
    wake()
  }
  const closed = new Promise((resolve) => { ws.onclose = resolve; ws.onerror = resolve })
  const read = async (n) => {
    while (buf.length < n) {
      const more = new Promise((resolve) => { wake = resolve })
      if (await Promise.race([more.then(() => false), closed.then(() => true)])) throw new Error('websocket closed')
    }
    const out = buf.slice(0, n); buf = buf.slice(n); return out
  }
  await new Promise((resolve, reject) => { ws.onopen = resolve; closed.then(() => reject(new Error('websocket did not open'))) })
  const version = new TextDecoder().decode(await read(12))
  ws.send(new TextEncoder().encode('RFB 003.008\n'))
  const [count] = await read(1)
  const types = [...await read(count)]
  if (!types.includes(1)) throw new Error(`no "None" security type in ${types}`)
  ws.send(new Uint8Array([1]))
  const result = new DataView((await read(4)).buffer).getUint32(0)
  if (result !== 0) throw new Error(`security result ${result}`)
  ws.send(new Uint8Array([1])) // ClientInit: shared
  const init = new DataView((await read(24)).buffer)
  await read(init.getUint32(20)) // the desktop's name
  const ev = new DataView(new ArrayBuffer(6))
  ev.setUint8(0, 5); ev.setUint8(1, 0); ev.setUint16(2, x); ev.setUint16(4, y)
  ws.send(ev.buffer)
  await new Promise((resolve) => setTimeout(resolve, 1000))
  ws.close()
  return { version, width: init.getUint16(0), height: init.getUint16(2) }
}

test('desktop: start, input, screenshots, noVNC through the proxy, view-only, stop', async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: make deps installs Debian's chromium`)
  // Its deadline follows the machine, as the waits below do: on a slow
  // one they add up past ten minutes, and the deadline killed the desktop
  // mid-test (websocket closed).
  const sb = await lizard.create('desktop', { timeoutMs: budget(600_000) })
  try {
    const never = await sb.desktop.info()
    assert.equal(never.running, false)
    assert.equal(never.width, null)

    const d = await sb.desktop.start({ width: 1024, height: 768 })
    assert.equal(d.running, true)
    assert.equal(d.width, 1024)
    assert.equal(d.height, 768)
    const url = new URL(d.url)
    const viewUrl = new URL(d.viewOnlyUrl)
    assert.ok(url.hostname.startsWith(`${sb.sandboxId}-6080.`), d.url)
    assert.ok(viewUrl.hostname.startsWith(`${sb.sandboxId}-6081.`), d.viewOnlyUrl)
    const token = url.searchParams.get('lizard_token')
    const viewToken = viewUrl.searchParams.get('lizard_token')
    assert.ok(token && viewToken && token !== viewToken, 'each page has a token of its own')

    const again = await sb.desktop.start({ width: 1280, height: 800 })
    assert.deepEqual(again, d, 'a running desktop keeps its size and URLs')
    assert.deepEqual(await sb.desktop.info(), d)

    // A page served in the sandbox, opened in the desktop's Chromium.
    await sb.fs.write('/tmp/www/index.html', PAGE)
    const serve = await sb.process.exec(`cd /tmp/www && setsid python3 -m http.server ${PAGE_PORT} --bind 127.0.0.1 > /tmp/http.log 2>&1 < /dev/null & for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:${PAGE_PORT}/ && exit 0; sleep 0.05; done; exit 1`)
    assert.equal(serve.exitCode, 0, serve.stderr)
    const blank = decodePng(await sb.desktop.screenshot())
    assert.equal(blank.width, 1024)
    assert.equal(blank.height, 768)

    await sb.desktop.openUrl(`http://127.0.0.1:${PAGE_PORT}/`)
    await waitFor('the page to load in Chromium', async () => (await events(sb)).some((e) => e.get('ev') === 'loaded'), 60_000)
    await sleep(1000) // the first paint

    await sb.desktop.moveMouse(123, 456)
    assert.deepEqual(await sb.desktop.cursorPosition(), { x: 123, y: 456 })

    await sb.desktop.click(512, 500)
    const clickAt = await waitFor('the click', async () => (await events(sb)).find((e) => e.get('ev') === 'up'))
    assert.equal(clickAt.get('b'), '0', 'left button')
    assert.deepEqual(await sb.desktop.cursorPosition(), { x: 512, y: 500 })

    await sb.desktop.click(512, 500, { button: 'right' })
    await waitFor('the right click', async () => (await events(sb)).some((e) => e.get('ev') === 'down' && e.get('b') === '2'))
    await sb.desktop.press('Escape') // the context menu
    await sb.desktop.click(512, 500) // focus back in the text area

    const before = decodePng(await sb.desktop.screenshot())
    await sb.desktop.type('hello lizard')
    await sb.desktop.press('BackSpace')
    const value = await waitFor('the typed text', async () => {
      const vs = (await events(sb)).filter((e) => e.get('ev') === 'value')
      const last = vs.at(-1)?.get('v')
      return last === 'hello lizar' && last
    })
    assert.equal(value, 'hello lizar')
    assert.ok((await events(sb)).some((e) => e.get('ev') === 'key' && e.get('k') === 'Backspace'), 'press sends the key')
    const after = decodePng(await sb.desktop.screenshot())
    assert.equal(after.width, 1024)
    assert.equal(after.height, 768)
    const gained = darkPixels(after) - darkPixels(before)
    assert.ok(gained > 1000, `the typed text shows on the screen (${gained} more dark pixels)`)

    const upsBefore = (await events(sb)).filter((e) => e.get('ev') === 'up').length
    await sb.desktop.drag(300, 400, 500, 450)
    const [down, up] = await waitFor('the drag', async () => {
      const es = await events(sb)
      const ups = es.filter((e) => e.get('ev') === 'up')
      if (ups.length <= upsBefore) return null
      const downs = es.filter((e) => e.get('ev') === 'down' && e.get('b') === '0')
      return [downs.at(-1), ups.at(-1)]
    })
    assert.equal(Number(up.get('x')) - Number(down.get('x')), 200, 'the drag moves 200 px right')
    assert.equal(Number(up.get('y')) - Number(down.get('y')), 50, 'and 50 px down')
    assert.deepEqual(await sb.desktop.cursorPosition(), { x: 500, y: 450 })

    await sb.desktop.scroll('down', 2)
    await waitFor('wheel events down', async () => (await events(sb)).filter((e) => e.get('ev') === 'wheel' && e.get('dy') === '1').length >= 2)
    await sb.desktop.scroll('up')
    await waitFor('wheel events up', async () => (await events(sb)).some((e) => e.get('ev') === 'wheel' && e.get('dy') === '-1'))

    // The view-only token opens 6081 and nothing else.
    const view6080 = await proxyGet(url.host, '/vnc.html', { 'X-Lizard-Access-Token': viewToken })
    assert.equal(view6080.status, 401, 'the view-only token does not admit the interactive page')
    const viaQuery = await proxyGet(url.host, `/vnc.html?lizard_token=${viewToken}`)
    assert.equal(viaQuery.status, 401)
    const sandboxToken = await proxyGet(url.host, '/vnc.html', { 'X-Lizard-Access-Token': token })
    assert.equal(sandboxToken.status, 200)
    assert.match(sandboxToken.body, /noVNC/)
    assert.equal((await proxyGet(viewUrl.host, '/vnc.html', { 'X-Lizard-Access-Token': token })).status, 401,
      'the interactive token does not admit the view-only page either')

    // Both pages in a real browser, through the proxy.
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: chromiumArgs(),
    })
    try {
      for (const [name, u] of [['view-only', d.viewOnlyUrl], ['interactive', d.url]]) {
        const page = await (await browser.newContext()).newPage()
        const res = await page.goto(u)
        assert.equal(res.status(), 200, `${name} page`)
        assert.equal(new URL(page.url()).searchParams.get('lizard_token'), null, 'the token is gone from the address bar')
        assert.match(await page.title(), /noVNC/)
        // noVNC connected through the proxy's WebSocket: its canvas has the screen's size.
        // Under a loaded machine its ~50 modules can be slow to come; a reload is
        // what a person would do, once.
        const screenShown = () => page.waitForFunction(() => {
          const c = document.querySelector('#noVNC_container canvas')
          return c && c.width === 1024 && c.height === 768
        }, null, { timeout: budget(45_000) })
        await screenShown().catch(async () => {
          await page.reload()
          return screenShown()
        }).catch(async (err) => {
          const state = await page.evaluate(() => {
            const c = document.querySelector('#noVNC_container canvas')
            return { canvas: c && [c.width, c.height], status: document.getElementById('noVNC_status')?.textContent }
          })
          throw new Error(`${name} page: noVNC did not show the screen: ${JSON.stringify(state)}: ${err.message}`)
        })
        // A WebSocket of our own, by the cookie, then RFB input.
        await sb.desktop.moveMouse(10, 10)
        const rfb = await page.evaluate(rfbPointer, [400, 300])
        assert.equal(rfb.version, 'RFB 003.008\n')
        assert.deepEqual([rfb.width, rfb.height], [1024, 768])
        if (name === 'view-only') {
          assert.deepEqual(await sb.desktop.cursorPosition(), { x: 10, y: 10 }, 'the view-only server ignores the pointer')
        } else {
          await waitFor('the pointer to move by VNC', async () => {
            const p = await sb.desktop.cursorPosition()
            return p.x === 400 && p.y === 300
          }, 5_000)
        }
        const stranger = await (await browser.newContext()).newPage()
        assert.equal((await stranger.goto(`${new URL(u).origin}/vnc.html`)).status(), 401, `${name} page without token`)
      }
    } finally {
      await browser.close()
    }

    // Stop: the pages go off the proxy, the URLs stay for the next start.
    await sb.desktop.stop()
    const stopped = await sb.desktop.info()
    assert.equal(stopped.running, false)
    assert.equal(stopped.url, d.url)
    assert.equal(stopped.viewOnlyUrl, d.viewOnlyUrl)
    assert.equal((await proxyGet(url.host, '/vnc.html', { 'X-Lizard-Access-Token': token })).status, 401)
    await assert.rejects(sb.desktop.screenshot(), /not running/)

    const restarted = await sb.desktop.start()
    assert.equal(restarted.running, true)
    assert.equal(restarted.url, d.url)
    assert.equal(restarted.viewOnlyUrl, d.viewOnlyUrl)
    assert.deepEqual([restarted.width, restarted.height], [1280, 800], 'a new start takes the new size')
    const shot = decodePng(await sb.desktop.screenshot())
    assert.deepEqual([shot.width, shot.height], [1280, 800])
    assert.equal((await proxyGet(url.host, '/vnc.html', { 'X-Lizard-Access-Token': token })).status, 200)
  } finally {
    await sb.kill()
  }
})

test('desktop on a template without one: exit 127 and desktop_not_supported', async () => {
  const sb = await lizard.create('base', { timeoutMs: 120_000 })
  try {
    for (const call of [() => sb.desktop.screenshot(), () => sb.desktop.click(1, 1), () => sb.desktop.cursorPosition()]) {
      await assert.rejects(call(), (err) => {
        assert.equal(err.code, 'DESKTOP_NOT_SUPPORTED', err.message)
        assert.match(err.message, /exit 127/)
        return true
      })
    }
    for (const call of [() => sb.desktop.start(), () => sb.desktop.info(), () => sb.desktop.stop()]) {
      await assert.rejects(call(), (err) => {
        assert.equal(err.status, 400, err.message)
        assert.equal(err.code, 'desktop_not_supported')
        return true
      })
    }
    await assert.rejects(sb.desktop.start({ width: 100, height: 100 }), (err) => err.status === 400)
  } finally {
    await sb.kill()
  }
})
