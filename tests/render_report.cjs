// Render an HTML report in headless Chromium (Playwright, Debian's chromium binary) and print what is
// on the page as JSON: node tests/render_report.cjs REPORT.html CHROMIUM_PATH
const { chromium } = require('playwright-core');

(async () => {
  const [report, executablePath] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
  const page = await browser.newPage({ viewport: { width: 1000, height: 1600 } });
  await page.goto('file://' + report);
  const seen = await page.evaluate(() => ({
    title: document.querySelector('h1').textContent,
    criteria: [...document.querySelectorAll('tr[class^="verdict-"]')].map((row) => ({
      verdict: row.className.replace('verdict-', ''),
      metric: row.children[3].textContent,
      why: row.children[7].textContent,
    })),
    cdfLines: [...document.querySelectorAll('svg.cdf polyline')].map((l) => l.getBBox().width),
    points: document.querySelectorAll('svg.throughput circle').length,
    bars: [...document.querySelectorAll('.bar')].map((b) => b.getBoundingClientRect().width),
    spans: document.querySelectorAll('svg.timeline rect').length,
  }));
  await browser.close();
  console.log(JSON.stringify(seen));
})().catch((err) => { console.error(err); process.exit(1); });
