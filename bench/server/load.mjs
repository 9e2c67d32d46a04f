#!/usr/bin/env node
// Load benchmark of `gizllm serve` against `gizllm bench` (the same workload offline, no HTTP).
//
//   node bench/server/load.mjs [--clients 1,16,64,256] [--window 30] [--repeat 2]
//        [--output-tokens 64] [--prompt-words 80] [--slots 16] [--threads 1] [--http-threads 1]
//        [--no-offline] [--json]
//
// Each point starts a fresh server (so its peak memory, VmHWM, is the point's own) and runs
// `clients` closed-loop clients on loopback, each sending one streamed /v1/chat/completions after
// another (greedy, max_tokens --output-tokens with ignore_eos, so every answer has exactly that
// many tokens). Request n asks about "item n": prompts differ from their fifth token on, so slots
// share only the template's start.
//
// Measuring: a warm-up lasts until every client has finished one request (beyond the slots the
// server queues, so with 256 clients that is a whole round), then a window of --window seconds.
// Everything is counted by when it arrived in the window: output tokens/s, requests/s (answers
// finished), time to first token (of first tokens that arrived), inter-token latency (gaps
// between two arrivals). At the window's end the clients disconnect (the server cancels). The
// process figures: the server's VmHWM at the end, the most threads seen (sampled every 100 ms),
// and the CPU time it used in the window per output token (user and system, all threads: HTTP
// included), a figure that other load on the machine disturbs far less than tokens/s.
//
// Offline peer: `gizllm bench --prompts` with the token ids of the same chats (read back from the
// server's /tokenize), the same output tokens, concurrency min(clients, slots) and the same
// --threads, max(16, 6 x concurrency) requests; its CPU time per output token leaves out what
// loading the model costs (a run of one token, measured once). Every point, server and offline,
// runs --repeat times; the best output tokens/s counts.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) {
    const next = all[i + 1];
    acc.push([a.slice(2), next === undefined || next.startsWith('--') ? 'true' : next]);
  }
  return acc;
}, []));
const clientsList = (args.clients ?? '1,16,64,256').split(',').map(Number);
const windowMs = Number(args.window ?? 30) * 1000;
const repeat = Number(args.repeat ?? 2);
const outputTokens = Number(args['output-tokens'] ?? 64);
const promptWords = Number(args['prompt-words'] ?? 80);
const slots = Number(args.slots ?? 16);
const threads = String(args.threads ?? 1);
const httpThreads = String(args['http-threads'] ?? 1);
const offline = args['no-offline'] !== 'true';
const gizllm = process.env.GIZLLM || path.resolve('build/gizllm');
const model = args.model ?? 'models/tiny-chat';
const log = (s) => process.stderr.write(s + '\n');

const kWords = ('the a river of light runs under old stone bridges where quiet people walk ' +
  'at night and count the boats that carry bread wine and letters to towns along the water ' +
  'while children watch from windows and the bells of distant churches ring for hours').split(' ');

// The chat of request n: distinct from "item n" on, about --prompt-words words long.
function messages(n) {
  const words = [];
  for (let i = 0; i < promptWords; ++i) words.push(kWords[(n * 13 + i * 7) % kWords.length]);
  return [{ role: 'user', content: `Tell me about item ${n}: ${words.join(' ')}.` }];
}

async function startServer() {
  const proc = spawn(gizllm, ['serve', '--model', model, '--port', '0', '--device', 'cpu',
                              '--threads', threads, '--http-threads', httpThreads,
                              '--slots', String(slots), '--max-pending', '4096'],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  let text = '';
  const port = await new Promise((resolve, reject) => {
    proc.on('exit', (c) => reject(new Error(`server exited ${c}: ${text}`)));
    proc.stderr.on('data', (d) => {
      text += d;
      const m = /on http:\/\/[\d.]+:(\d+)/.exec(text);
      if (m) resolve(Number(m[1]));
    });
  });
  proc.removeAllListeners('exit');
  proc.stderr.resume();
  return { proc, url: `http://127.0.0.1:${port}` };
}

async function stopServer(server) {
  const exited = new Promise((resolve) => server.proc.on('exit', resolve));
  server.proc.kill('SIGTERM');
  await exited;
}

function procStatus(pid) {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const get = (k) => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
    return { hwmKb: get('VmHWM'), threads: get('Threads') };
  } catch { return null; }
}

// CPU seconds the process has used, user and system.
function cpuSeconds(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / kTicks;
  } catch { return NaN; }
}
const kTicks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;

function post(url, route, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request(`${url}${route}`, {
      method: 'POST', headers: { 'content-type': 'application/json',
                                 'content-length': Buffer.byteLength(data) },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(text))
                                                  : reject(new Error(`${res.statusCode} ${text}`))));
    });
    req.on('error', reject);
    req.end(data);
  });
}

// One streamed chat. Calls on.token(count, now) as tokens arrive and on.done(now) at the end;
// resolves when the answer ended or the request was aborted.
function streamChat(agent, url, n, on, requests) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ messages: messages(n), max_tokens: outputTokens,
                                  temperature: 0, stream: true, ignore_eos: true,
                                  stream_options: { include_usage: true } });
    let buffer = '';
    let counted = 0;
    const req = http.request(`${url}/v1/chat/completions`, {
      method: 'POST', agent, headers: { 'content-type': 'application/json',
                                        'content-length': Buffer.byteLength(body) },
    }, (res) => {
      if (res.statusCode !== 200) {
        on.error(`status ${res.statusCode}`);
        res.resume();
        res.on('end', resolve);
        return;
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
          const now = performance.now();
          if (chunk.error) on.error(chunk.error.message);
          if (chunk.usage) {
            // Tokens whose text came with a later chunk (a character cut between tokens).
            if (chunk.usage.completion_tokens > counted) {
              on.token(chunk.usage.completion_tokens - counted, now, /*text=*/false);
            }
            counted = chunk.usage.completion_tokens;
            continue;
          }
          const delta = chunk.choices[0]?.delta;
          if (delta?.content || delta?.reasoning_content || delta?.tool_calls) {
            counted += 1;
            on.token(1, now, /*text=*/true);
          }
        }
      });
      res.on('end', () => {
        requests.delete(req);
        on.done(performance.now());
        resolve();
      });
      res.on('error', () => resolve());
      res.on('close', () => {
        requests.delete(req);
        resolve();
      });
    });
    requests.add(req);
    req.on('error', (e) => {
      requests.delete(req);
      if (!on.aborted()) on.error(e.message);
      resolve();
    });
    req.end(body);
  });
}

function percentile(values, p) {
  if (!values.length) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function runServerPoint(clients) {
  const server = await startServer();
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4096 });
  const requests = new Set();
  let threadsPeak = 0;
  const sampler = setInterval(() => {
    const s = procStatus(server.proc.pid);
    if (s) threadsPeak = Math.max(threadsPeak, s.threads);
  }, 100);

  const start = performance.now();
  let windowStart = Infinity;  // set when every client has finished one request
  let windowEnd = Infinity;
  let cpuStart = NaN;
  let stopping = false;
  let warm = 0;
  let next = 0;
  const stats = { tokens: 0, done: 0, ttft: [], itl: [], errors: [] };
  const inWindow = (t) => t >= windowStart && t < windowEnd;
  let windowDone;
  const windowOver = new Promise((resolve) => { windowDone = resolve; });

  const client = async () => {
    let first = true;
    while (!stopping) {
      const sent = performance.now();
      let last = null;
      await streamChat(agent, server.url, next++, {
        token: (count, now, text) => {
          if (inWindow(now)) stats.tokens += count;
          if (!text) return;
          if (last === null) {
            if (inWindow(now)) stats.ttft.push(now - sent);
          } else if (last >= windowStart && inWindow(now)) {
            stats.itl.push(now - last);
          }
          last = now;
        },
        done: (now) => { if (inWindow(now)) stats.done += 1; },
        error: (e) => stats.errors.push(e),
        aborted: () => stopping,
      }, requests);
      if (first) {
        first = false;
        if (++warm === clients) {
          cpuStart = cpuSeconds(server.proc.pid);
          windowStart = performance.now();
          windowEnd = windowStart + windowMs;
          setTimeout(windowDone, windowMs);
        }
      }
    }
  };
  const all = Array.from({ length: clients }, client);
  await windowOver;
  stopping = true;
  const hwmKb = procStatus(server.proc.pid)?.hwmKb ?? 0;
  const cpu = cpuSeconds(server.proc.pid) - cpuStart;
  for (const req of requests) req.destroy();
  await Promise.all(all);
  clearInterval(sampler);
  agent.destroy();
  // The server stays up through the cancellations: one more request must be answered.
  const health = await new Promise((resolve) => {
    http.get(`${server.url}/health`, (res) => { res.resume(); resolve(res.statusCode); })
      .on('error', () => resolve(0));
  });
  if (health !== 200) stats.errors.push(`health after the point: ${health}`);
  await stopServer(server);
  const seconds = windowMs / 1000;
  return {
    clients, warmup_s: (windowStart - start) / 1000, window_s: seconds,
    requests_per_s: stats.done / seconds, output_tokens_per_s: stats.tokens / seconds,
    ttft_p50_ms: percentile(stats.ttft, 0.5), ttft_p99_ms: percentile(stats.ttft, 0.99),
    itl_p50_ms: percentile(stats.itl, 0.5), itl_p99_ms: percentile(stats.itl, 0.99),
    cpu_ms_per_token: (cpu * 1000) / stats.tokens,
    server_hwm_mib: hwmKb / 1024, server_threads: threadsPeak, errors: stats.errors.length,
    first_error: stats.errors[0],
  };
}

// The token ids of the chats requests 0..count-1 send, as the server renders them.
async function writePrompts(count, file) {
  const server = await startServer();
  const lines = [];
  let total = 0;
  for (let n = 0; n < count; ++n) {
    const r = await post(server.url, '/tokenize', { messages: messages(n) });
    total += r.tokens.length;
    lines.push(JSON.stringify({ tokens: r.tokens }));
  }
  await stopServer(server);
  fs.writeFileSync(file, lines.join('\n') + '\n');
  return total / count;
}

// `gizllm bench` with `options`: its JSON and the CPU seconds it used (the shell's `times` gives
// the child's user and system seconds).
function benchWithCpu(options) {
  const out = execFileSync('sh', ['-c', '"$0" "$@"; times', gizllm, 'bench', '--model', model,
                                  '--device', 'cpu', '--threads', threads, ...options, '--json'],
                           { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  const lines = out.trim().split('\n');
  const result = JSON.parse(lines.find((l) => l.startsWith('{')));
  const seconds = (t) => Number(/(\d+)m([\d.]+)s/.exec(t)?.[1] ?? NaN) * 60 +
                         Number(/(\d+)m([\d.]+)s/.exec(t)?.[2] ?? NaN);
  const [user, system] = lines[lines.length - 1].trim().split(/\s+/).map(seconds);
  return { result, cpu: user + system };
}

// What loading the model and making the engine cost, taken off each offline run's CPU time: one
// request of one token.
let loadCpu = null;
function runOffline(concurrency, requestCount, file) {
  if (loadCpu === null) {
    loadCpu = benchWithCpu(['--requests', '1', '--prompt-tokens', '1', '--output-tokens', '1',
                            '--concurrency', '1']).cpu;
  }
  const { result, cpu } = benchWithCpu(['--prompts', file, '--requests', String(requestCount),
                                        '--concurrency', String(concurrency),
                                        '--output-tokens', String(outputTokens)]);
  result.cpu_ms_per_token = ((cpu - loadCpu) * 1000) / result.generated_tokens;
  return result;
}

const best = (runs) => runs.reduce((a, b) => (b.output_tokens_per_s > a.output_tokens_per_s ? b : a));
const load = () => os.loadavg().map((x) => x.toFixed(2)).join(' ');

const offlineRequests = (c) => Math.max(16, 6 * c);
const promptFile = path.join(os.tmpdir(), `gizllm-load-prompts-${process.pid}.jsonl`);
const promptTokens = await writePrompts(offlineRequests(Math.min(slots, Math.max(...clientsList))),
                                        promptFile);
log(`prompts: ${promptTokens.toFixed(1)} tokens on average; ${outputTokens} output tokens; ` +
    `${slots} slots; --threads ${threads}; --http-threads ${httpThreads}`);

const results = [];
const offlineBest = new Map();
for (const clients of clientsList) {
  const runs = [];
  for (let i = 0; i < repeat; ++i) {
    const r = await runServerPoint(clients);
    r.load = load();
    log(`${String(clients).padStart(4)} clients, run ${i + 1}: ${r.output_tokens_per_s.toFixed(1)} ` +
        `tok/s, ${r.requests_per_s.toFixed(2)} req/s, TTFT p50 ${r.ttft_p50_ms.toFixed(0)} ms, ` +
        `${r.cpu_ms_per_token.toFixed(2)} CPU ms/token, warm-up ${r.warmup_s.toFixed(1)} s, ` +
        `${r.errors} errors, load ${r.load}`);
    if (r.first_error) log(`  first error: ${r.first_error}`);
    runs.push(r);
  }
  const row = best(runs);
  const concurrency = Math.min(clients, slots);
  if (offline && !offlineBest.has(concurrency)) {
    const offRuns = [];
    for (let i = 0; i < repeat; ++i) {
      const o = runOffline(concurrency, offlineRequests(concurrency), promptFile);
      o.load = load();
      log(`  offline concurrency ${concurrency}, run ${i + 1}: ` +
          `${o.output_tokens_per_s.toFixed(1)} tok/s, ${o.cpu_ms_per_token.toFixed(2)} CPU ` +
          `ms/token, load ${o.load}`);
      offRuns.push(o);
    }
    offlineBest.set(concurrency, best(offRuns));
  }
  row.errors_all_runs = runs.reduce((s, r) => s + r.errors, 0);
  row.offline = offlineBest.get(concurrency) ?? null;
  results.push(row);
}
fs.rmSync(promptFile, { force: true });

if (args.json === 'true') {
  console.log(JSON.stringify({ prompt_tokens: promptTokens, output_tokens: outputTokens, slots,
                               threads: Number(threads), http_threads: Number(httpThreads),
                               window_s: windowMs / 1000, repeat, results }, null, 1));
} else {
  const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');
  console.log(`tiny-chat on the CPU, --threads ${threads}, --http-threads ${httpThreads}, ` +
              `${slots} slots; streamed chats of ${f(promptTokens)} prompt tokens and ` +
              `${outputTokens} output tokens; window ${windowMs / 1000} s after warm-up; ` +
              `best of ${repeat}; ${os.cpus().length} cores`);
  console.log('');
  console.log('| clients | req/s | output tok/s | offline tok/s (conc.) | server/offline | ' +
              'CPU ms/token server / offline | TTFT p50 / p99 ms | ITL p50 / p99 ms | VmHWM | ' +
              'threads | errors | load avg |');
  console.log('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- |');
  for (const r of results) {
    const off = r.offline;
    console.log(`| ${r.clients} | ${f(r.requests_per_s, 2)} | ${f(r.output_tokens_per_s)} | ` +
                `${off ? `${f(off.output_tokens_per_s)} (${off.concurrency})` : '-'} | ` +
                `${off ? f(r.output_tokens_per_s / off.output_tokens_per_s, 3) : '-'} | ` +
                `${f(r.cpu_ms_per_token, 2)} / ${off ? f(off.cpu_ms_per_token, 2) : '-'} | ` +
                `${f(r.ttft_p50_ms, 0)} / ${f(r.ttft_p99_ms, 0)} | ` +
                `${f(r.itl_p50_ms)} / ${f(r.itl_p99_ms)} | ${f(r.server_hwm_mib, 0)} MiB | ` +
                `${r.server_threads} | ${r.errors_all_runs} | ${r.load} |`);
  }
}
