// Shared by the dashboard's browser tests: Chromium with a fresh profile,
// and the sign-in.
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { chromium } from 'playwright-core'
import { budget } from './budget.mjs'

export const BASE = process.env.LIZARD_API_URL
export const CHROMIUM = '/usr/bin/chromium'

// browserContext starts Chromium with a fresh profile; close() removes it.
export async function browserContext () {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: make deps installs Debian's chromium`)
  const dir = await mkdtemp(join(tmpdir(), 'lizard-dashboard-'))
  const ctx = await chromium.launchPersistentContext(dir, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 900 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  })
  ctx.setDefaultTimeout(budget(30_000))
  return { ctx, close: async () => { await ctx.close(); await rm(dir, { recursive: true, force: true }) } }
}

// signIn opens the dashboard and signs in with key.
export async function signIn (page, key) {
  await page.goto(BASE + '/')
  await page.fill('#apikey', key)
  await page.click('#signin')
}

