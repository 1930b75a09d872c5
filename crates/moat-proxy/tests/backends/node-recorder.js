// node-recorder is an HTTP/1.1 backend on Node's http server (llhttp, strict mode) that
// reports every request the server parsed, for moat's test that its forwarded bytes frame
// the same requests in parsers that are not moat's own
// (crates/moat-proxy/tests/backend_parsers.rs).
//
// It listens on 127.0.0.1 (an ephemeral port), prints "listening PORT", then one JSON
// object per line, in the same form as go-recorder:
//   {"kind":"request","conn":N,"method":M,"target":T,"headers":[[name,value]...],"body":B64,
//    "trailers":[[name,value]...]}
//   {"kind":"request",...,"body_error":E}   the body could not be read as framed
//   {"kind":"refused","conn":N,"status":S,"code":C}  llhttp could not parse the bytes
// Every request is answered 200 with `x-upstream: yes` and the body "upstream".
'use strict';
const http = require('http');

function emit(record) {
  process.stdout.write(JSON.stringify(record) + '\n');
}

let nextConn = 0;
const connIds = new WeakMap();

const server = http.createServer({ insecureHTTPParser: false }, (req, res) => {
  const conn = connIds.get(req.socket);
  const headers = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    headers.push([req.rawHeaders[i], req.rawHeaders[i + 1]]);
  }
  const chunks = [];
  let done = false;
  const finish = (error) => {
    if (done) return;
    done = true;
    const record = {
      kind: 'request',
      conn,
      method: req.method,
      target: req.url,
      headers,
      body: Buffer.concat(chunks).toString('base64'),
      trailers: [],
    };
    for (let i = 0; i < req.rawTrailers.length; i += 2) {
      record.trailers.push([req.rawTrailers[i], req.rawTrailers[i + 1]]);
    }
    if (error) record.body_error = String(error);
    emit(record);
    if (!res.socket || res.socket.destroyed) return;
    res.writeHead(200, { 'x-upstream': 'yes', 'content-length': '8' });
    res.end('upstream');
  };
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => finish(null));
  req.on('error', (e) => finish(e.code || e.message));
  req.on('aborted', () => finish('aborted'));
});
server.on('connection', (socket) => {
  nextConn += 1;
  connIds.set(socket, nextConn);
});
server.on('clientError', (err, socket) => {
  // A connection closed by the peer between requests is no parse error.
  if (err.code === 'ECONNRESET' || err.code === 'EPIPE') {
    socket.destroy();
    return;
  }
  emit({ kind: 'refused', conn: connIds.get(socket), status: '400', code: err.code || err.message });
  if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n');
  else socket.destroy();
});
server.keepAliveTimeout = 30000;
server.listen(0, '127.0.0.1', () => {
  emit_port();
});
function emit_port() {
  process.stdout.write(`listening ${server.address().port}\n`);
}
