// Follow a running run in the dashboard (Playwright, headless Chromium): open its page once, then wait, without
// reloading, until a trial appears that the page did not have when it opened. Prints JSON.
// node tests/follow_run.cjs RUN_URL CHROMIUM_PATH TIMEOUT_MS [SCREENSHOT.png]
const { chromium } = require('playwright-core');

(async () => {
  const [url, executablePath, timeoutMs, screenshot] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  page.on('pageerror', (err) => errors.push(String(err)));
  let navigations = 0;
  page.on('framenavigated', (frame) => { if (frame === page.mainFrame()) navigations += 1; });
  await page.goto(url, { waitUntil: 'load' });
  const opened = await page.evaluate(() => {
    window.__sameDocument = true;  // a reload would drop it
    return { status: document.getElementById('live-status').textContent,
             trials: document.querySelectorAll('table.live-trials tbody tr').length,
             reportTrials: document.querySelectorAll('table.trials tbody tr').length };
  });
  let appeared = null;
  try {
    await page.waitForFunction((before) => document.querySelectorAll('table.live-trials tbody tr').length > before,
                               opened.reportTrials, { timeout: Number(timeoutMs), polling: 250 });
    appeared = await page.evaluate(() => ({
      trials: [...document.querySelectorAll('table.live-trials tbody tr')].map((r) => r.children[0].textContent),
      gates: document.querySelectorAll('#live-gates li').length,
      budget: document.getElementById('live-budget').textContent,
      sameDocument: window.__sameDocument === true,
    }));
  } catch (err) {
    appeared = { error: String(err).slice(0, 300) };
  }
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: false });
  await browser.close();
  console.log(JSON.stringify({ opened, appeared, navigations, errors }));
})().catch((err) => { console.error(err); process.exit(1); });
