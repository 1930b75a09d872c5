// node-client reads responses through moat with Node's http client (llhttp, strict), for
// moat's test that the responses it frames read as one response each in parsers that are
// not moat's own (crates/moat-proxy/tests/backend_parsers.rs).
//
// Usage: node node-client.js BASE_URL N [--h2]. For each case i < N it sends, on one
// kept-alive connection, GET BASE_URL/r/i and then GET BASE_URL/second, and prints one
// JSON object per case, as go-client does: {"case":i,"first":R,"second":R},
// R = {"status":S,"body":B64,"proto":P} or {"error":E}. With --h2 it speaks HTTP/2 with
// prior knowledge (Node's http2, nghttp2), the two requests as streams of one session.
'use strict';
const http = require('http');
const http2 = require('http2');

const [base, n, mode] = [process.argv[2], Number(process.argv[3]), process.argv[4]];
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

// The HTTP/2 session, opened again when moat closed the previous one.
let session;
function get2(path) {
  return new Promise((resolve) => {
    if (!session || session.closed || session.destroyed) {
      session = http2.connect(base);
      session.on('error', () => {});
    }
    let done = false;
    const finish = (r) => {
      if (!done) {
        done = true;
        resolve(r);
      }
    };
    const req = session.request({ ':path': path });
    let status;
    const chunks = [];
    req.on('response', (h) => { status = h[':status']; });
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => finish(status === undefined
      ? { error: 'no response' }
      : { status, body: Buffer.concat(chunks).toString('base64'), proto: 'HTTP/2.0' }));
    req.on('error', (e) => finish({ error: 'body: ' + (e.code || e.message) }));
    req.on('close', () => finish({ error: 'body: closed, code ' + req.rstCode }));
    req.setTimeout(10000, () => req.close(http2.constants.NGHTTP2_CANCEL));
    req.end();
  });
}

function get(url) {
  return new Promise((resolve) => {
    const req = http.get(url, { agent }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({
        status: res.statusCode,
        body: Buffer.concat(chunks).toString('base64'),
        proto: 'HTTP/' + res.httpVersion,
      }));
      res.on('error', (e) => resolve({ error: 'body: ' + (e.code || e.message) }));
      res.on('aborted', () => resolve({ error: 'body: aborted' }));
    });
    req.on('error', (e) => resolve({ error: e.code || e.message }));
    req.setTimeout(10000, () => req.destroy(new Error('timeout')));
  });
}

(async () => {
  for (let i = 0; i < n; i++) {
    const [first, second] = mode === '--h2'
      ? [await get2(`/r/${i}`), await get2('/second')]
      : [await get(`${base}/r/${i}`), await get(`${base}/second`)];
    process.stdout.write(JSON.stringify({ case: i, first, second }) + '\n');
  }
  agent.destroy();
  if (session) session.close();
})();
