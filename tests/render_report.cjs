// Open an infragent page in headless Chromium (Playwright, Debian's chromium binary) and print what a reader
// sees as JSON: the headline's criteria, every chart's series, the trials table before and after a sort, where
// each trial's link lands, the trace link, the load time. node tests/render_report.cjs URL CHROMIUM_PATH [SCREENSHOT.png]
const { chromium } = require('playwright-core');

(async () => {
  const [url, executablePath, screenshot] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const errors = [];
  page.on('pageerror', (err) => errors.push(String(err)));
  const started = Date.now();
  await page.goto(url, { waitUntil: 'load' });
  const loadMs = Date.now() - started;
  const timing = await page.evaluate(() => {
    const nav = performance.getEntriesByType('navigation')[0];
    return { domContentLoadedMs: nav.domContentLoadedEventEnd, loadMs: nav.loadEventEnd };
  });
  const seen = await page.evaluate(() => ({
    title: document.querySelector('h1').textContent,
    badge: (document.querySelector('#headline .badge') || {}).textContent || null,
    stopped: (document.querySelector('#headline .stopped') || {}).textContent || null,
    criteria: [...document.querySelectorAll('table.criteria tbody tr[class^="verdict-"]')].map((row) => ({
      verdict: row.className.replace('verdict-', ''),
      scenario: row.children[0].textContent, phase: row.children[1].textContent, bucket: row.children[2].textContent,
      metric: row.children[3].textContent, why: row.children[8].textContent,
    })),
    charts: [...document.querySelectorAll('svg.chart')].map((svg) => {
      const series = {};
      svg.querySelectorAll('[data-series]').forEach((mark) => {
        const name = mark.dataset.series.replace(/ \(n=\d+\)$/, '');
        const box = mark.getBBox();
        const s = series[name] || (series[name] = { marks: 0, width: 0, height: 0 });
        s.marks += mark.tagName === 'polyline' ? mark.points.numberOfItems : 1;
        s.width = Math.max(s.width, box.width); s.height = Math.max(s.height, box.height);
      });
      return { kind: [...svg.classList].filter((c) => c !== 'chart')[0],
               title: (svg.querySelector('.title') || {}).textContent, series,
               xLabel: (svg.querySelector('.x-label') || {}).textContent,
               yLabel: (svg.querySelector('.y-label') || {}).textContent,
               ticks: svg.querySelectorAll('.tick').length };
    }),
    trialsBefore: [...document.querySelectorAll('table.trials tbody tr')].map((r) => r.children[0].textContent),
    trialRecords: [...document.querySelectorAll('table.trials tbody tr')].map((r) => {
      const link = r.children[0].querySelector('a');
      const target = link && document.getElementById(decodeURIComponent(link.getAttribute('href').slice(1)));
      const row = target && target.closest('tr');
      return [r.children[0].textContent, row ? row.children[0].textContent : null];
    }),
    traceHref: (document.querySelector('a.trace-file') || {}).href || null,
    perfettoButton: !!document.querySelector('button.perfetto'),
    spans: document.querySelectorAll('svg.timeline rect.span').length,
    hypotheses: document.querySelectorAll('table.chains tbody tr').length,
    probes: document.querySelectorAll('table.probes tbody tr').length,
  }));
  const header = await page.$('table.trials th:nth-child(6)');  // objective [CI]
  if (header) {
    await header.click();
    seen.sortedAscending = await page.evaluate(() => [...document.querySelectorAll('table.trials tbody tr')].map(
      (r) => [r.children[0].textContent, parseFloat(r.children[5].dataset.value)]));
    await header.click();
    seen.sortedDescending = await page.evaluate(() => [...document.querySelectorAll('table.trials tbody tr')].map(
      (r) => [r.children[0].textContent, parseFloat(r.children[5].dataset.value)]));
  }
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  await browser.close();
  console.log(JSON.stringify({ ...seen, loadMs, timing, errors }));
})().catch((err) => { console.error(err); process.exit(1); });
