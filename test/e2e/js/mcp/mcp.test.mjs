// The MCP server with the official TypeScript MCP client
// (@modelcontextprotocol/sdk), over Streamable HTTP (/mcp on the API
// listener) and over stdio (`lizard mcp`, spawned by the client with
// LIZARD_API_URL and LIZARD_API_KEY, as a desktop agent would). The Go test
// TestMCP runs it and passes LIZARD_BIN and LIZARD_OTHER_KEY, a key of
// another project.
import { describe, test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { budget } from '../budget.mjs'

const apiUrl = process.env.LIZARD_API_URL
const apiKey = process.env.LIZARD_API_KEY
const otherKey = process.env.LIZARD_OTHER_KEY
const bin = process.env.LIZARD_BIN
const [proxyHost, proxyPort] = (process.env.LIZARD_TEST_PROXY ?? '127.0.0.1:8081').split(':')
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// The two ways an agent reaches lizard, with a key.
const transports = {
  http: (key) => new StreamableHTTPClientTransport(new URL(`${apiUrl}/mcp`), { requestInit: { headers: { Authorization: `Bearer ${key}` } } }),
  stdio: (key) => new StdioClientTransport({ command: bin, args: ['mcp'], env: { LIZARD_API_URL: apiUrl, LIZARD_API_KEY: key }, stderr: 'pipe' })
}

async function connect (kind, key = apiKey) {
  const client = new Client({ name: 'lizard-e2e', version: '1.0.0' })
  const transport = transports[kind](key)
  const stderr = []
  transport.stderr?.on('data', (b) => stderr.push(b.toString()))
  try {
    await client.connect(transport)
  } catch (e) {
    e.stderr = stderr.join('')
    throw e
  }
  return client
}

const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n')

// call is a tool call that must succeed; a long one (a create from a cold
// template) reports progress, which keeps the client's timeout from
// running out.
async function call (client, name, args, opts = {}) {
  const res = await client.callTool({ name, arguments: args }, undefined,
    { timeout: budget(120_000), resetTimeoutOnProgress: true, onprogress: () => {}, ...opts })
  assert.ok(!res.isError, `${name} ${JSON.stringify(args).slice(0, 200)}: ${text(res)}`)
  return res
}

// toolError is a tool call that must fail with a tool error.
async function toolError (client, name, args) {
  const res = await client.callTool({ name, arguments: args }, undefined, { timeout: budget(60_000) })
  assert.equal(res.isError, true, `${name}: not an error: ${text(res)}`)
  return text(res)
}

function proxyGet (hostname, path, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: proxyHost, port: Number(proxyPort), path, headers: { host: hostname, ...headers } }, (res) => {
      let body = ''
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

for (const kind of ['http', 'stdio']) {
  describe(`MCP over ${kind}`, () => {
    let client
    before(async () => { client = await connect(kind) })
    after(async () => { await client?.close() })

    test('tools and their schemas, resource templates', async () => {
      const { tools } = await client.listTools()
      const by = Object.fromEntries(tools.map((t) => [t.name, t]))
      for (const name of ['create_sandbox', 'list_sandboxes', 'get_sandbox', 'kill_sandbox', 'run_command', 'start_command',
        'read_command_output', 'read_file', 'write_file', 'list_directory', 'run_code', 'expose_port', 'pause_sandbox',
        'resume_sandbox', 'snapshot_sandbox', 'restore_snapshot', 'fork_sandbox', 'desktop_screenshot', 'desktop_click',
        'desktop_type']) {
        const t = by[name]
        assert.ok(t, `no tool ${name}`)
        assert.match(t.description, /^[^\n]{20,300}$/, `${name}'s description`)
        assert.equal(t.inputSchema.type, 'object')
        assert.equal(t.inputSchema.additionalProperties, false, `${name} admits unknown arguments`)
      }
      const run = by.run_command.inputSchema
      assert.deepEqual([...run.required].sort(), ['command', 'sandboxId'])
      assert.deepEqual([run.properties.timeoutSeconds.minimum, run.properties.timeoutSeconds.maximum, run.properties.timeoutSeconds.default], [1, 600, 60])
      assert.match(by.run_command.description, /capped at 32 KiB/)
      assert.deepEqual(by.run_code.inputSchema.properties.language.enum, ['python', 'javascript', 'typescript', 'bash', 'r', 'java'])
      assert.deepEqual(by.read_file.inputSchema.properties.encoding.enum, ['text', 'base64'])
      assert.equal(by.kill_sandbox.annotations.destructiveHint, true)
      assert.equal(by.list_sandboxes.annotations.readOnlyHint, true)
      const { resourceTemplates } = await client.listResourceTemplates()
      assert.deepEqual(resourceTemplates.map((r) => r.uriTemplate).sort(),
        ['lizard://sandboxes/{id}/files/{+path}', 'lizard://sandboxes/{id}/logs'])
    })

    test('a sandbox: a file, python3 on it, its output; a port exposed and fetched; progress; a cancelled command is killed', async () => {
      const created = await call(client, 'create_sandbox', { template: 'base', timeoutSeconds: 600 })
      const id = created.structuredContent.sandboxId
      assert.match(id, /^\w/)
      try {
        await call(client, 'write_file', { sandboxId: id, path: '/tmp/hello.py', content: 'import sys\nprint("hello from python", sys.version_info.major)\n' })
        const ran = await call(client, 'run_command', { sandboxId: id, command: 'python3 /tmp/hello.py > /tmp/out.txt && echo done' })
        assert.equal(ran.structuredContent.exitCode, 0, text(ran))
        assert.equal(ran.structuredContent.stdout, 'done\n')
        const out = await call(client, 'read_file', { sandboxId: id, path: '/tmp/out.txt' })
        assert.equal(text(out), 'hello from python 3\n')
        const res = await client.readResource({ uri: `lizard://sandboxes/${id}/files/tmp/out.txt` })
        assert.equal(res.contents[0].text, 'hello from python 3\n')
        const logs = await client.readResource({ uri: `lizard://sandboxes/${id}/logs` })
        assert.match(logs.contents[0].text, /python3 \/tmp\/hello\.py/)
        const failed = await call(client, 'run_command', { sandboxId: id, command: 'echo to stderr >&2; exit 42' })
        assert.equal(failed.structuredContent.exitCode, 42)
        assert.equal(failed.structuredContent.stderr, 'to stderr\n')
        assert.match(text(failed), /exit code 42/)

        // A server started in the background, exposed, fetched through
        // the preview proxy with the port's token.
        await call(client, 'write_file', { sandboxId: id, path: '/tmp/www/index.html', content: 'served through mcp\n' })
        const started = await call(client, 'start_command', { sandboxId: id, command: 'cd /tmp/www && exec python3 -m http.server 8000' })
        const cmd = started.structuredContent.commandId
        const up = await call(client, 'run_command', { sandboxId: id, command: 'for i in $(seq 1 200); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1' })
        assert.equal(up.structuredContent.exitCode, 0, 'the server listens')
        const exposed = (await call(client, 'expose_port', { sandboxId: id, port: 8000 })).structuredContent
        assert.ok(exposed.hostname.startsWith(`${id}-8000.`), exposed.hostname)
        assert.equal(new URL(exposed.url).searchParams.get('lizard_token'), exposed.accessToken)
        const page = await proxyGet(exposed.hostname, '/index.html', { 'X-Lizard-Access-Token': exposed.accessToken })
        assert.equal(page.status, 200)
        assert.equal(page.body, 'served through mcp\n')
        assert.equal((await proxyGet(exposed.hostname, '/index.html', {})).status, 401)
        const log = (await call(client, 'read_command_output', { sandboxId: id, commandId: cmd })).structuredContent
        assert.equal(log.running, true)
        assert.match(log.output, /GET \/index\.html/)
        await call(client, 'stop_command', { sandboxId: id, commandId: cmd })
        const stopped = (await call(client, 'read_command_output', { sandboxId: id, commandId: cmd, waitSeconds: 10 })).structuredContent
        assert.equal(stopped.running, false)

        // Progress of a long command, with its latest line.
        const notes = []
        await call(client, 'run_command', { sandboxId: id, command: 'for i in 1 2 3 4; do echo step $i; sleep 1; done' },
          { onprogress: (p) => notes.push(p) })
        assert.ok(notes.length >= 2, `progress notifications: ${JSON.stringify(notes)}`)
        assert.ok(notes.some((p) => /step \d/.test(p.message ?? '')), JSON.stringify(notes))
        for (let i = 1; i < notes.length; i++) assert.ok(notes[i].progress > notes[i - 1].progress, 'progress grows')

        // A long command whose call is cancelled is killed in the sandbox.
        const ac = new AbortController()
        const long = client.callTool({ name: 'run_command', arguments: { sandboxId: id, command: 'echo $$ > /tmp/long.pid; exec sleep 600', timeoutSeconds: 600 } },
          undefined, { signal: ac.signal, timeout: budget(600_000) })
        let pid = ''
        for (const end = Date.now() + budget(30_000); !pid && Date.now() < end; await sleep(100)) {
          const r = await client.callTool({ name: 'read_file', arguments: { sandboxId: id, path: '/tmp/long.pid' } })
          if (!r.isError) pid = text(r).trim()
        }
        assert.match(pid, /^\d+$/, 'the long command started')
        const alive = await call(client, 'run_command', { sandboxId: id, command: `kill -0 ${pid}` })
        assert.equal(alive.structuredContent.exitCode, 0, 'the long command runs')
        ac.abort()
        await assert.rejects(long)
        let gone = false
        for (const end = Date.now() + budget(20_000); !gone && Date.now() < end; await sleep(200)) {
          const r = await call(client, 'run_command', { sandboxId: id, command: `kill -0 ${pid} 2>/dev/null` })
          gone = r.structuredContent.exitCode !== 0
        }
        assert.ok(gone, `process ${pid} still runs in the sandbox after the call was cancelled`)
      } finally {
        await call(client, 'kill_sandbox', { sandboxId: id })
      }
      const after = await toolError(client, 'get_sandbox', { sandboxId: id })
      assert.match(after, /not found/)
    })

    test('code: state kept between calls of a context, a matplotlib chart as an image', async () => {
      // The first sandbox of the template may wait for its ready state:
      // the create says so while it runs.
      const notes = []
      const created = await call(client, 'create_sandbox', { template: 'code-interpreter-v1', timeoutSeconds: 600 },
        { timeout: budget(300_000), onprogress: (p) => notes.push(p) })
      assert.ok(notes.length >= 1 && notes[0].message === 'creating a sandbox of template code-interpreter-v1', JSON.stringify(notes))
      const id = created.structuredContent.sandboxId
      try {
        await call(client, 'run_code', { sandboxId: id, code: 'x = 21' })
        const twice = await call(client, 'run_code', { sandboxId: id, code: 'print("x is", x)\nx * 2' })
        assert.equal(twice.structuredContent.stdout, 'x is 21\n')
        assert.equal(twice.structuredContent.results[0].text, '42')
        assert.match(text(twice), /text: 42/)

        const ctx = (await call(client, 'create_code_context', { sandboxId: id, language: 'python' })).structuredContent.contextId
        await call(client, 'run_code', { sandboxId: id, contextId: ctx, code: 'y = 5' })
        const own = await call(client, 'run_code', { sandboxId: id, contextId: ctx, code: 'y + 1' })
        assert.equal(own.structuredContent.results[0].text, '6')
        const isolated = await call(client, 'run_code', { sandboxId: id, contextId: ctx, code: 'x' })
        assert.equal(isolated.structuredContent.error.name, 'NameError', 'a context has state of its own')
        assert.match(text(isolated), /NameError/)

        const js = await call(client, 'run_code', { sandboxId: id, language: 'javascript', code: 'const z = 20\nz + 22' })
        assert.equal(js.structuredContent.results[0].text, '42')
        // Code longer than a command's argument goes to the interpreter
        // through a file.
        const big = await call(client, 'run_code', { sandboxId: id, code: '# ' + 'x'.repeat(200_000) + '\nprint("big", x)' })
        assert.equal(big.structuredContent.stdout, 'big 21\n')

        const chart = await call(client, 'run_code', {
          sandboxId: id,
          code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()'
        })
        const images = chart.content.filter((c) => c.type === 'image')
        assert.equal(images.length, 1, JSON.stringify(chart.content.map((c) => c.type)))
        assert.equal(images[0].mimeType, 'image/png')
        const png = Buffer.from(images[0].data, 'base64')
        assert.equal(png.subarray(1, 4).toString(), 'PNG')
        assert.ok(png.length > 1000, `a PNG of ${png.length} bytes`)
      } finally {
        await call(client, 'kill_sandbox', { sandboxId: id })
      }
    })

    test("keys: a wrong one is refused; another project's sandbox is not found", async () => {
      await assert.rejects(connect(kind, 'lz_not_a_valid_key'), (e) => {
        // The API's refusal, its status and its words.
        if (kind === 'http') {
          assert.equal(e.code, 401)
          assert.match(e.message, /invalid_api_key/)
        } else {
          assert.match(e.stderr, /LIZARD_API_KEY is refused .*invalid API key.*401 invalid_api_key/)
        }
        return true
      })
      const created = await call(client, 'create_sandbox', { template: 'base', timeoutSeconds: 300 })
      const id = created.structuredContent.sandboxId
      const other = await connect(kind, otherKey)
      try {
        for (const [name, args] of [['get_sandbox', {}], ['run_command', { command: 'true' }], ['read_file', { path: '/etc/hostname' }], ['kill_sandbox', {}]]) {
          const msg = await toolError(other, name, { sandboxId: id, ...args })
          assert.match(msg, /not found \(404/, `${name} with another project's key`)
        }
        const { structuredContent } = await call(other, 'list_sandboxes', {})
        assert.deepEqual(structuredContent.sandboxes, [])
        await assert.rejects(other.readResource({ uri: `lizard://sandboxes/${id}/files/etc/hostname` }), /not found/)
      } finally {
        await other.close()
        await call(client, 'kill_sandbox', { sandboxId: id })
      }
    })
  })
}

// The desktop tools, over HTTP only (the tools are the same over stdio,
// and a desktop with Chromium is slow to start): a screenshot is an image
// of the screen, a click moves the mouse there, typing reaches the focused
// window.
describe('MCP desktop', () => {
  test('a screenshot as an image, a click and typing on the screen', async () => {
    const client = await connect('http')
    const created = await call(client, 'create_sandbox', { template: 'desktop', timeoutSeconds: 900 }, { timeout: budget(300_000) })
    const id = created.structuredContent.sandboxId
    const run = async (command) => (await call(client, 'run_command', { sandboxId: id, command, envs: { DISPLAY: ':0' } })).structuredContent
    const waitFor = async (what, fn, ms) => {
      for (const end = Date.now() + budget(ms); Date.now() < end; await sleep(500)) if (await fn()) return
      assert.fail(`timed out waiting for ${what}`)
    }
    try {
      // The screenshot starts the desktop (1280×800 by default).
      const shot = await call(client, 'desktop_screenshot', { sandboxId: id }, { timeout: budget(300_000) })
      assert.deepEqual(shot.structuredContent, { width: 1280, height: 800 })
      const image = shot.content.find((c) => c.type === 'image')
      assert.equal(image?.mimeType, 'image/png')
      const png = Buffer.from(image.data, 'base64')
      assert.equal(png.subarray(1, 4).toString(), 'PNG')
      assert.equal(png.readUInt32BE(16), 1280)

      await call(client, 'desktop_click', { sandboxId: id, x: 123, y: 456 })
      assert.match((await run('xdotool getmouselocation')).stdout, /^x:123 y:456 /)

      // A page whose title follows what is typed into it.
      await call(client, 'start_command', { sandboxId: id, command: `chromium --new-window "data:text/html,<title>start</title><textarea autofocus style='width:95vw;height:90vh' oninput='document.title=this.value'></textarea>"`, envs: { DISPLAY: ':0' } })
      await waitFor('Chromium shows the page', async () => /start/.test((await run('xdotool getactivewindow getwindowname')).stdout), 120_000)
      await call(client, 'desktop_click', { sandboxId: id, x: 640, y: 400 })
      await call(client, 'desktop_type', { sandboxId: id, text: 'hello lizard' })
      await waitFor('the typed text in the page', async () => /hello lizard/.test((await run('xdotool getactivewindow getwindowname')).stdout), 30_000)
      await call(client, 'desktop_key', { sandboxId: id, keys: 'ctrl+a BackSpace' })
      await waitFor('the text erased', async () => !/hello lizard/.test((await run('xdotool getactivewindow getwindowname')).stdout), 30_000)
    } finally {
      await call(client, 'kill_sandbox', { sandboxId: id })
      await client.close()
    }
  })
})
