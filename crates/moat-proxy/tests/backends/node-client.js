// node-client reads responses through moat with Node's http client (llhttp, strict), for
// moat's test that the responses it frames read as one response each in parsers that are
// not moat's own (crates/moat-proxy/tests/backend_parsers.rs).
//
// Usage: node node-client.js BASE_URL N. For each case i < N it sends, on one kept-alive
// connection, GET BASE_URL/r/i and then GET BASE_URL/second, and prints one JSON object
// per case, as go-client does: {"case":i,"first":R,"second":R}, R = {"status":S,"body":B64}
// or {"error":E}.
'use strict';
const http = require('http');

const [base, n] = [process.argv[2], Number(process.argv[3])];
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

function get(url) {
  return new Promise((resolve) => {
    const req = http.get(url, { agent }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () =>
        resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString('base64') }));
      res.on('error', (e) => resolve({ error: 'body: ' + (e.code || e.message) }));
      res.on('aborted', () => resolve({ error: 'body: aborted' }));
    });
    req.on('error', (e) => resolve({ error: e.code || e.message }));
    req.setTimeout(10000, () => req.destroy(new Error('timeout')));
  });
}

(async () => {
  for (let i = 0; i < n; i++) {
    const first = await get(`${base}/r/${i}`);
    const second = await get(`${base}/second`);
    process.stdout.write(JSON.stringify({ case: i, first, second }) + '\n');
  }
  agent.destroy();
})();
