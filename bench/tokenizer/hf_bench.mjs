// Hugging Face tokenizers (Rust, through @anush008/tokenizers) on the same work as
// tokenizer_bench: load a tokenizer.json, encode the golden corpus lines (each a text) repeated to
// --mb megabytes, on one thread. Prints one JSON line.
//   node bench/tokenizer/hf_bench.mjs --tokenizer PATH [--mb 20] [--repeat 3] [--load-only]
import fs from "node:fs";
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const hf = require("@anush008/tokenizers");

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
};
const path = opt("--tokenizer");
const mb = Number(opt("--mb", "20"));
const repeat = Number(opt("--repeat", "3"));
const corpusPath = opt("--corpus", "tests/golden/tokenizer/corpus.jsonl");

// CPU time of this process (user + system), as tokenizer_bench measures: on a shared, loaded
// machine it varies much less than wall time.
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
let load = Infinity, tok;
for (let r = 0; r < repeat; ++r) {
  const t0 = cpu();
  tok = hf.Tokenizer.fromFile(path);
  load = Math.min(load, cpu() - t0);
}
if (args.includes("--load-only")) {
  console.log(JSON.stringify({ load_s: load }));
  process.exit(0);
}
const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
// The corpus lines, each a text of its own, repeated until they hold --mb megabytes.
const bytes = mb * 1e6;
const texts = [];
let size = 0;
outer: for (;;) {
  for (const l of lines) {
    texts.push(l);
    size += Buffer.byteLength(l);
    if (size >= bytes) break outer;
  }
}
let best = Infinity, tokens = 0;
for (let r = 0; r < repeat; ++r) {
  // One call encodes every text in a loop inside Rust (TOKENIZERS_PARALLELISM=false and
  // RAYON_NUM_THREADS=1 keep it on one thread).
  const t0 = cpu();
  const encodings = await tok.encodeBatch(texts, { addSpecialTokens: false });
  const t = cpu() - t0;
  tokens = 0;
  for (const e of encodings) tokens += e.getLength();
  best = Math.min(best, t);
}
console.log(JSON.stringify({ load_s: load, texts: texts.length, bytes: size, tokens, encode_s: best,
                             tokens_per_s: Math.round(tokens / best) }));
