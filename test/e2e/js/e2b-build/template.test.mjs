// E2B's Template builder on lizard (run by TestE2BTemplateBuild once per
// E2B SDK version): a template from "python:3.12-slim" (E2B_TEST_IMAGE, an
// image of the test's own registry) with runCmd, copy, setEnvs,
// setWorkdir, setUser and setStartCmd(..., waitForPort(8000)); a sandbox of
// it serves on 8000 as soon as Sandbox.create returns; the build's log
// streams; a second build uploads nothing; a failing step fails the build
// with its output; another project (E2B_OTHER_KEY) sees none of it.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { sdk, Sandbox, api, get } from '../e2b/helpers.mjs'
import { budget } from '../budget.mjs'

const { Template, waitForPort } = sdk
const image = process.env.E2B_TEST_IMAGE
const otherKey = process.env.E2B_OTHER_KEY
const name = `e2e-py-${process.env.E2B_SDK}`
const buildOpts = { requestTimeoutMs: budget(60_000) }
const page = `served from the template built with ${process.env.E2B_SDK}\n`

// context is a directory of files for copy(): app/ with a page and a
// script, and a file at the top.
function context() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'e2b-build-'))
  fs.mkdirSync(path.join(dir, 'app', 'static'), { recursive: true })
  // Each SDK's run has files of its own to upload (the server keeps a
  // project's files across builds).
  fs.writeFileSync(path.join(dir, 'app', 'index.html'), page)
  fs.writeFileSync(path.join(dir, 'app', 'static', 'note.txt'), 'nested file\n')
  fs.writeFileSync(path.join(dir, 'run.sh'), '#!/bin/sh\necho ran-$1\n', { mode: 0o644 })
  return dir
}

function pythonTemplate(dir) {
  return Template({ fileContextPath: dir })
    .fromImage(image)
    // E2B's steps start as "user", which the image lacks: the build makes it.
    .runCmd(`id -un > /home/user/built-as.txt && echo "streamed-$((6*7)) by ${process.env.E2B_SDK}"`)
    .runCmd('mkdir -p /srv && chown user:user /srv', { user: 'root' })
    .copy('app', '/srv/app/')
    .copy('run.sh', '/usr/local/bin/run.sh', { mode: 0o755, user: 'root' })
    .setEnvs({ GREETING: 'hello from setEnvs', TOOLS: '${LANG}/tools' })
    .setWorkdir('/srv/app')
    .setUser('web')
    .runCmd('id -un > ~/web.txt')
    .setStartCmd('python3 -m http.server 8000', waitForPort(8000))
}

function build(t, opts = {}) {
  const logs = []
  const done = Template.build(t, name, { ...buildOpts, ...opts, onBuildLogs: (e) => logs.push(String(e.message)) })
  return { done, logs }
}

test('Template.build from an image: a sandbox of it serves on 8000 at once', async () => {
  const dir = context()
  const first = build(pythonTemplate(dir))
  const info = await first.done
  assert.equal(info.templateId, name)
  assert.ok(info.buildId, 'a build id')
  // The server's log lines (the RUN step's output) reached the SDK.
  assert.ok(first.logs.some((l) => l.includes(`streamed-42 by ${process.env.E2B_SDK}`)), first.logs.join('\n'))
  assert.ok(first.logs.some((l) => l.includes("Uploaded 'app'")), first.logs.join('\n'))
  assert.equal(await Template.exists(name), true)

  const sbx = await Sandbox.create(name, { timeoutMs: budget(120_000) })
  try {
    // The start command runs from the template's ready state: no wait.
    const { status, body } = await get(sbx.getHost(8000), {}, '/index.html')
    assert.equal(status, 200, body)
    assert.equal(body, page)
    const r = await sbx.commands.run('id -un; pwd; echo "$GREETING|$TOOLS"; cat /home/user/built-as.txt /home/web/web.txt static/note.txt; ' +
      'stat -c "%U %a" /srv/app/index.html /usr/local/bin/run.sh; run.sh ok')
    assert.equal(r.stdout, 'web\n/srv/app\nhello from setEnvs|C.UTF-8/tools\nuser\nweb\nnested file\nuser 644\nroot 755\nran-ok\n')
  } finally {
    await sbx.kill()
  }

  // The same template again: its files are the server's already.
  const second = build(pythonTemplate(dir))
  await second.done
  assert.ok(second.logs.some((l) => l.includes("Skipping upload of 'app', already cached")), second.logs.join('\n'))
  assert.ok(!second.logs.some((l) => l.includes('Uploaded ')), second.logs.join('\n'))
  const tags = await Template.getTags(name)
  assert.deepEqual(tags.map((t) => t.tag), ['default'])
})

test('a failing step fails the build with its output', async () => {
  const t = Template().fromImage(image).runCmd('echo "failing-step-said-$((6*7))" >&2; exit 3')
  await assert.rejects(Template.build(t, `${name}-bad`, buildOpts), (e) => {
    assert.ok(e instanceof sdk.BuildError, `${e.name}: ${e.message}`)
    assert.match(e.message, /exit code 3/)
    assert.match(e.message, /failing-step-said-42/)
    return true
  })
  assert.equal(await Template.exists(`${name}-bad`), false)
})

test('another project cannot see or use the template', async () => {
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists(name, { apiKey: otherKey }), false)
  await assert.rejects(Sandbox.create(name, { apiKey: otherKey, timeoutMs: 30_000 }), (e) => {
    assert.match(e.message, /not found|does not exist|no template/i)
    return true
  })
  const tags = await api('GET', `/templates/${name}/tags`, undefined, otherKey)
  assert.equal(tags.status, 404, tags.text)
  const listed = await api('GET', '/templates', undefined, otherKey)
  assert.ok(!listed.json.some((t) => t.templateID === name), listed.text)
})
