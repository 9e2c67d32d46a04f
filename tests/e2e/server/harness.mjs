// Starts `gizllm serve` on a free loopback port and stops it; small HTTP helpers.
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';

export const GIZLLM = process.env.GIZLLM || path.resolve('build/gizllm');
export const MODEL = process.env.GIZLLM_MODEL || 'models/tiny-chat';

// Resolves to {url, port, model, stop(), log()} once the server says where it listens.
export function startServer(extra = [], { timeoutMs = 120000, model = MODEL } = {}) {
  const args = ['serve', '--model', model, '--port', '0', '--device', 'cpu', ...extra];
  const proc = spawn(GIZLLM, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`server did not start in ${timeoutMs} ms:\n${log}`));
    }, timeoutMs);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}:\n${log}`));
    });
    let started = false;
    proc.stderr.on('data', (d) => {
      log += d;
      // Once: what the server writes after (e.g. "stopped") must not run this again, which would
      // drop the exit listener stop() adds.
      if (started) return;
      const m = /serving (\S+) .* on http:\/\/([\d.]+):(\d+)/.exec(log);
      if (!m) return;
      started = true;
      clearTimeout(timer);
      proc.removeAllListeners('exit');
      const port = Number(m[3]);
      resolve({
        url: `http://127.0.0.1:${port}`,
        port,
        model: m[1],
        proc,
        log: () => log,
        stop: () => new Promise((done) => {
          if (proc.exitCode !== null) return done(proc.exitCode);
          const kill = setTimeout(() => proc.kill('SIGKILL'), 10000);
          proc.on('exit', (code) => { clearTimeout(kill); done(code); });
          proc.kill('SIGTERM');
        }),
      });
    });
  });
}

// One request on a fresh connection with raw bytes; resolves to {status, headers, body, json}.
// `chunks`: pieces written with `gapMs` between them (a slow client).
export function rawRequest(port, chunks, { gapMs = 0, timeoutMs = 20000 } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    const timer = setTimeout(() => { socket.destroy(); reject(new Error('no answer in time')); },
                             timeoutMs);
    socket.on('data', (d) => { data = Buffer.concat([data, d]); });
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(parseResponse(data));
    });
    (async () => {
      for (const c of chunks) {
        if (socket.destroyed) return;
        socket.write(c);
        if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
      }
    })();
  });
}

function parseResponse(buffer) {
  const text = buffer.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  if (end < 0) return { status: 0, headers: {}, body: '', json: null };
  const lines = text.slice(0, end).split('\r\n');
  const status = Number(lines[0].split(' ')[1]);
  const headers = {};
  for (const l of lines.slice(1)) {
    const i = l.indexOf(':');
    headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
  }
  let body = buffer.subarray(end + 4);
  if (headers['content-length']) body = body.subarray(0, Number(headers['content-length']));
  const s = body.toString('utf8');
  let json = null;
  try { json = JSON.parse(s); } catch { /* not JSON */ }
  return { status, headers, body: s, json };
}

// An HTTP/1.1 request as bytes, closing the connection after the answer.
export function httpBytes(method, target, body = '', headers = {}) {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body);
  let head = `${method} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n`;
  if (!('content-length' in headers) && (b.length || method === 'POST')) {
    head += `Content-Length: ${b.length}\r\n`;
  }
  for (const [k, v] of Object.entries(headers)) {
    if (k !== 'content-length') head += `${k}: ${v}\r\n`;
    else head += `Content-Length: ${v}\r\n`;
  }
  head += 'Content-Type: application/json\r\n\r\n';
  return Buffer.concat([Buffer.from(head), b]);
}

export async function postJson(base, target, body, headers = {}) {
  const res = await fetch(base + target, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, json, text };
}
