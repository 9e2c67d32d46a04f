#!/usr/bin/env node
// Load generator for `gizllm serve`: closed-loop clients on loopback, each sending one streamed
// request after another for a fixed duration. Reports requests/s, output tokens/s, time to first
// token and inter-token latency (p50/p99), and the server's peak memory and thread count.
//
//   node bench/load/load.mjs [--clients 1,16,64,256] [--duration 20] [--prompt-tokens 128]
//        [--output-tokens 64] [--slots 16] [--url URL] [--json]
// Without --url it starts `build/gizllm serve` on a free port (tiny-chat) and reads its /proc
// figures. Each request is a /v1/completions of a prompt of --prompt-tokens token ids (distinct
// per request, so no prefix is shared) and max_tokens --output-tokens with ignore_eos, so each
// request makes exactly that many tokens, as `gizllm bench` does.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]?.startsWith('--') || all[i + 1] === undefined ? 'true' : all[i + 1]]);
  return acc;
}, []));
const clientsList = (args.clients ?? '1,16,64,256').split(',').map(Number);
const duration = Number(args.duration ?? 20) * 1000;
const promptTokens = Number(args['prompt-tokens'] ?? 128);
const outputTokens = Number(args['output-tokens'] ?? 64);
const slots = Number(args.slots ?? 16);
const gizllm = process.env.GIZLLM || path.resolve('build/gizllm');

async function startServer() {
  const proc = spawn(gizllm, ['serve', '--port', '0', '--device', 'cpu', '--slots', String(slots),
                              '--context', String(promptTokens + outputTokens + 16),
                              ...(args['server-args'] ? args['server-args'].split(' ') : [])],
                     { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    proc.on('exit', (c) => reject(new Error(`server exited ${c}: ${log}`)));
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /on http:\/\/[\d.]+:(\d+)/.exec(log);
      if (m) resolve(Number(m[1]));
    });
  });
  proc.removeAllListeners('exit');
  return { proc, url: `http://127.0.0.1:${port}` };
}

function procFigures(pid) {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const get = (k) => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
    return { rssKb: get('VmRSS'), hwmKb: get('VmHWM'), threads: get('Threads') };
  } catch { return null; }
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });

// One streamed completion; resolves to {ttft, gaps[], tokens} (times in seconds).
function request(url, prompt) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt, max_tokens: outputTokens, temperature: 0, stream: true,
                                  ignore_eos: true,
                                  stream_options: { include_usage: true } });
    const start = process.hrtime.bigint();
    let last = null;
    let ttft = null;
    const gaps = [];
    let tokens = 0;
    let buffer = '';
    const req = http.request(`${url}/v1/completions`, {
      method: 'POST', agent, headers: { 'content-type': 'application/json',
                                        'content-length': Buffer.byteLength(body) },
    }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        return reject(new Error(`status ${res.statusCode}`));
      }
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buffer += d;
        let at;
        while ((at = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
          const chunk = JSON.parse(event.slice(6));
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
          if (!chunk.choices.length || !chunk.choices[0].text) continue;
          const now = process.hrtime.bigint();
          if (ttft === null) ttft = Number(now - start) / 1e9;
          else gaps.push(Number(now - last) / 1e9);
          last = now;
        }
      });
      res.on('end', () => resolve({ ttft, gaps, tokens }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function run(url, clients, pid) {
  const ttfts = [];
  const gaps = [];
  let done = 0;
  let tokens = 0;
  let errors = 0;
  let peak = { hwmKb: 0, threads: 0 };
  const sampler = pid ? setInterval(() => {
    const f = procFigures(pid);
    if (f) peak = { hwmKb: Math.max(peak.hwmKb, f.rssKb), threads: Math.max(peak.threads, f.threads) };
  }, 100) : null;
  const start = Date.now();
  let counter = 0;
  const worker = async (w) => {
    while (Date.now() - start < duration) {
      // Distinct token ids per request: no two prompts share a prefix.
      const n = counter++;
      const prompt = Array.from({ length: promptTokens }, (_, i) => 300 + ((n * 7919 + i * 31) % 7000));
      try {
        const r = await request(url, prompt);
        done += 1;
        tokens += r.tokens;
        if (r.ttft !== null) ttfts.push(r.ttft);
        gaps.push(...r.gaps);
      } catch { errors += 1; }
    }
  };
  await Promise.all(Array.from({ length: clients }, (_, w) => worker(w)));
  const elapsed = (Date.now() - start) / 1000;
  if (sampler) clearInterval(sampler);
  ttfts.sort((a, b) => a - b);
  gaps.sort((a, b) => a - b);
  return {
    clients, seconds: elapsed, requests: done, errors,
    requests_per_s: done / elapsed, output_tokens_per_s: tokens / elapsed,
    ttft_p50_ms: percentile(ttfts, 0.5) * 1e3, ttft_p99_ms: percentile(ttfts, 0.99) * 1e3,
    itl_p50_ms: percentile(gaps, 0.5) * 1e3, itl_p99_ms: percentile(gaps, 0.99) * 1e3,
    server_rss_peak_mib: peak.hwmKb / 1024, server_threads_peak: peak.threads,
  };
}

const server = args.url ? { url: args.url, proc: null } : await startServer();
const results = [];
for (const c of clientsList) {
  const r = await run(server.url, c, server.proc?.pid);
  results.push(r);
  if (!args.json) {
    console.error(`${String(c).padStart(4)} clients: ${r.requests_per_s.toFixed(2)} req/s, ` +
                  `${r.output_tokens_per_s.toFixed(1)} tok/s, TTFT p50 ${r.ttft_p50_ms.toFixed(1)} ` +
                  `p99 ${r.ttft_p99_ms.toFixed(1)} ms, ITL p50 ${r.itl_p50_ms.toFixed(1)} ` +
                  `p99 ${r.itl_p99_ms.toFixed(1)} ms, RSS ${r.server_rss_peak_mib.toFixed(0)} MiB, ` +
                  `${r.server_threads_peak} threads, ${r.errors} errors`);
  }
}
if (server.proc) {
  server.proc.kill('SIGTERM');
}
agent.destroy();
console.log(JSON.stringify({ prompt_tokens: promptTokens, output_tokens: outputTokens, slots,
                             results }, null, 1));
