// Click a page's "Open in Perfetto" button in headless Chromium with ui.perfetto.dev answered by a stand-in
// that speaks Perfetto's postMessage handshake (PING -> PONG, then {perfetto: {buffer, title, fileName}}), and
// print as JSON what the stand-in received and every request the browser made (nothing may be uploaded).
// node tests/open_in_perfetto.cjs URL CHROMIUM_PATH
const { chromium } = require('playwright-core');

const STAND_IN = `<!doctype html><title>perfetto stand-in</title><script>
window.received = null;
window.addEventListener('message', (ev) => {
  if (ev.data === 'PING') { ev.source.postMessage('PONG', '*'); return; }
  if (ev.data && ev.data.perfetto) {
    const p = ev.data.perfetto;
    window.received = { bytes: p.buffer.byteLength, title: p.title, fileName: p.fileName,
                        head: new TextDecoder().decode(new Uint8Array(p.buffer).slice(0, 64)) };
  }
});
</script>`;

(async () => {
  const [url, executablePath] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath, args: ['--no-sandbox', '--disable-dev-shm-usage'] });
  const context = await browser.newContext();
  const requests = [];
  context.on('request', (r) => requests.push({ method: r.method(), url: r.url().slice(0, 200),
                                               bodyBytes: (r.postDataBuffer() || Buffer.alloc(0)).length }));
  await context.route('https://ui.perfetto.dev/**', (route) =>
    route.fulfill({ status: 200, contentType: 'text/html', body: STAND_IN }));
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (err) => errors.push(String(err)));
  await page.goto(url, { waitUntil: 'load' });
  const [popup] = await Promise.all([context.waitForEvent('page'), page.click('button.perfetto')]);
  await popup.waitForLoadState('load');
  await popup.waitForFunction(() => window.received !== null, null, { timeout: 30000 });
  const received = await popup.evaluate(() => window.received);
  const note = await page.evaluate(() => (document.querySelector('.perfetto-note') || {}).textContent || '');
  await browser.close();
  console.log(JSON.stringify({ received, popupUrl: popup.url(), requests, note, errors }));
})().catch((err) => { console.error(err); process.exit(1); });
