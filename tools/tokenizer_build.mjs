// Builds small test tokenizers with Hugging Face tokenizers (through @anush008/tokenizers) from
// the golden corpus and tiny-chat's held-out texts, and saves their tokenizer.json files under
// tests/golden/tokenizer/:
//   bert-uncased.json, bert-cased.json: WordPiece, BertNormalizer, BertPreTokenizer,
//     BertProcessing, WordPiece decoder.
//   unigram.json: XLM-RoBERTa style Unigram (scores from piece frequencies), NFKC and a Replace
//     normalizer, Metaspace pre-tokenizer and decoder, RobertaProcessing.
//   unigram-bytes.json: the same with byte_fallback and a ByteFallback decoder.
//   wordpiece-mixed.json: WordPiece with NFD, StripAccents, Lowercase, Strip normalizers and
//     Whitespace, Digits, Punctuation pre-tokenizers.
//   unigram-first.json: Unigram with Metaspace's "first" prepend scheme.
//   unigram-precompiled.json: Unigram with a Precompiled normalizer (a small character map).
//   word-level.json: WordLevel with Nmt, WhitespaceSplit and CharDelimiterSplit, no decoder.
//   split-behaviors.json: word-level.json with Split pre-tokenizers of every behavior.
// The vocabularies are made here from counts (the binding exposes no configurable trainers).
// Run from the repository root: node tools/tokenizer_build.mjs
import fs from "node:fs";
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const hf = require("@anush008/tokenizers");

const golden = "tests/golden/tokenizer";
const texts = [
  ...fs.readFileSync(`${golden}/corpus.jsonl`, "utf8").split("\n").filter((l) => l)
      .map((l) => JSON.parse(l)),
  ...fs.readFileSync("models/tiny-chat/heldout.jsonl", "utf8").split("\n").filter((l) => l)
      .map((l) => JSON.parse(l).text),
];

function count(map, key, n = 1) { map.set(key, (map.get(key) || 0) + n); }
function top(map, n, min = 1) {
  return [...map.entries()].filter(([, c]) => c >= min).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
      .slice(0, n);
}

function buildBert(lowercase, mixed = false) {
  let normalizer = hf.bertNormalizer({ cleanText: true, handleChineseChars: true,
                                      stripAccents: lowercase, lowercase });
  let pre = hf.bertPreTokenizer();
  if (mixed) {
    // Other normalizers and pre-tokenizers in sequences.
    normalizer = hf.sequenceNormalizer([hf.nfdNormalizer(), hf.stripAccentsNormalizer(),
                                        hf.lowercase(), hf.stripNormalizer(true, true)]);
    pre = hf.sequencePreTokenizer([hf.whitespacePreTokenizer(), hf.digitsPreTokenizer(true),
                                   hf.punctuationPreTokenizer("contiguous")]);
  }
  const words = new Map(), chars = new Map(), suffixes = new Map();
  for (const t of texts) {
    for (const [w] of pre.preTokenizeString(normalizer.normalizeString(t))) {
      count(words, w);
      const cs = [...w];
      cs.forEach((c) => count(chars, c));
      for (let k = 1; k < cs.length && k <= 4; ++k) count(suffixes, cs.slice(cs.length - k).join(""));
    }
  }
  const vocab = {};
  let id = 0;
  const add = (t) => { if (!(t in vocab) && !t.includes("\0")) vocab[t] = id++; };
  ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].forEach(add);
  // Characters seen at least twice (rarer ones stay unknown), alone and as continuations.
  for (const [c] of top(chars, 100000, 2)) { add(c); add("##" + c); }
  for (const [s] of top(suffixes, 600, 3)) add("##" + s);
  for (const [w] of top(words, 2500, 2)) add(w);
  const tok = new hf.Tokenizer(hf.WordPiece.init(vocab, { unkToken: "[UNK]",
                                                        continuingSubwordPrefix: "##",
                                                        maxInputCharsPerWord: 40 }));
  tok.setNormalizer(normalizer);
  tok.setPreTokenizer(pre);
  tok.setPostProcessor(hf.bertProcessing(["[SEP]", vocab["[SEP]"]], ["[CLS]", vocab["[CLS]"]]));
  tok.setDecoder(hf.wordPieceDecoder("##", true));
  tok.addSpecialTokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]);
  return tok;
}

function buildUnigram(byteFallback, scheme = "always") {
  const normalizer = hf.sequenceNormalizer([hf.nfkcNormalizer(), hf.replace("  ", " ")]);
  const pre = hf.metaspacePreTokenizer("▁", scheme);
  const pieces = new Map(), chars = new Map();
  for (const t of texts) {
    for (const [w] of pre.preTokenizeString(normalizer.normalizeString(t))) {
      const cs = [...w];
      cs.forEach((c) => count(chars, c));
      // Every substring of up to 6 characters is a candidate piece.
      for (let i = 0; i < cs.length; ++i) {
        for (let k = 2; k <= 6 && i + k <= cs.length; ++k) count(pieces, cs.slice(i, i + k).join(""));
      }
    }
  }
  const chosen = [...top(chars, 100000, 2), ...top(pieces, 4000, 3)];
  const total = chosen.reduce((s, [, c]) => s + c, 0);
  const vocab = [["<unk>", 0], ["<s>", 0], ["</s>", 0], ["<pad>", 0], ["<mask>", 0]];
  if (byteFallback) {
    for (let b = 0; b < 256; ++b) {
      vocab.push([`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, 0]);
    }
  }
  const seen = new Set(vocab.map(([p]) => p));
  for (const [p, c] of chosen) {
    if (seen.has(p)) continue;
    seen.add(p);
    // Longer pieces a little cheaper than their parts, as trained unigram models tend to be.
    vocab.push([p, Math.log(c / total) + 0.1 * [...p].length]);
  }
  const tok = new hf.Tokenizer(hf.Unigram.init(vocab, { unkId: 0, byteFallback }));
  tok.setNormalizer(normalizer);
  tok.setPreTokenizer(pre);
  tok.setPostProcessor(hf.robertaProcessing(["</s>", 2], ["<s>", 1]));
  tok.setDecoder(byteFallback
      ? hf.sequenceDecoder([hf.replaceDecoder("▁", " "), hf.byteFallbackDecoder(), hf.fuseDecoder(),
                            hf.stripDecoder(" ", 1, 0)])
      : hf.metaspaceDecoder("▁", scheme));
  tok.addSpecialTokens(["<unk>", "<s>", "</s>", "<pad>", "<mask>"]);
  return tok;
}

// SentencePiece's precompiled character map: a darts-clone double array over the UTF-8 keys whose
// values are offsets of the replacements in a blob of NUL-terminated strings, laid out as
// [u32 trie bytes][u32 units][replacements]. Built here for a few mappings so that the Precompiled
// normalizer can be tested against Hugging Face's reading of the same bytes.
function precompiledCharsmap(mappings) {
  const enc = new TextEncoder();
  let strings = [];
  let offset = 0;
  const root = { children: new Map(), value: -1 };
  for (const [key, replacement] of mappings) {
    let node = root;
    for (const b of enc.encode(key)) {
      if (!node.children.has(b)) node.children.set(b, { children: new Map(), value: -1 });
      node = node.children.get(b);
    }
    node.value = offset;
    const bytes = enc.encode(replacement);
    strings.push(...bytes, 0);
    offset += bytes.length + 1;
  }
  const units = [0];
  const used = new Set([0]);
  const ensure = (n) => { while (units.length <= n) units.push(0); };
  // Each node at position p gets a base b: child c at b ^ c, its value (leaf) at b ^ 0 = b.
  const queue = [[root, 0]];
  while (queue.length) {
    const [node, pos] = queue.shift();
    const labels = [...node.children.keys()];
    if (node.value >= 0) labels.push(0);
    if (labels.length === 0) continue;
    let base = 1;
    while (labels.some((c) => used.has(base ^ c)) || (base ^ pos) >= (1 << 21)) ++base;
    labels.forEach((c) => used.add(base ^ c));
    ensure(base ^ 255);
    const offset = pos ^ base;
    units[pos] = (units[pos] & ((1 << 31) | (1 << 8) | 0xff)) | (offset << 10);
    if (node.value >= 0) {
      units[pos] |= 1 << 8;
      units[base] = (node.value | (1 << 31)) >>> 0;
    }
    for (const [c, child] of node.children) {
      units[base ^ c] = c;  // label; offset and leaf bit set when the child is placed
      queue.push([child, base ^ c]);
    }
  }
  const out = [];
  const u32 = (v) => { out.push(v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, (v >>> 24) & 0xff); };
  u32(units.length * 4);
  units.forEach((u) => u32(u >>> 0));
  out.push(...strings);
  return out;
}

function buildPrecompiledUnigram() {
  const tok = buildUnigram(false);
  const charsmap = precompiledCharsmap([
    ["\ufb01", "fi"], ["\u212b", "\u00c5"], ["\uff21", "A"], ["\uff41", "a"], ["\u2460", "1"],
    ["\u3000", " "], ["\u00a0", " "], ["\uff76", "\u30ab"], ["e\u0301", "\u00e9"], ["\u2126", "\u03a9"],
    ["\u00bd", "1/2"], ["\u2028", " "], ["\u200b", ""], ["\ufeff", ""], ["K", "k"], ["\u0301", ""],
  ]);
  tok.setNormalizer(hf.sequenceNormalizer([hf.precompiled(charsmap), hf.replace("  ", " ")]));
  return tok;
}

// WordLevel: whole words, with WhitespaceSplit and CharDelimiterSplit pre-tokenizers, Nmt, NFKD
// and Lowercase normalizers, no decoder (Hugging Face joins tokens with spaces).
function buildWordLevel() {
  const normalizer = hf.sequenceNormalizer([hf.nmt(), hf.nfkdNormalizer(), hf.lowercase()]);
  const pre = hf.sequencePreTokenizer([hf.whitespaceSplitPreTokenizer(), hf.charDelimiterSplit("-")]);
  const words = new Map();
  for (const t of texts) {
    for (const [w] of pre.preTokenizeString(normalizer.normalizeString(t))) count(words, w);
  }
  const vocab = { "<unk>": 0 };
  let id = 1;
  for (const [w] of top(words, 3000, 2)) if (!w.includes("\0")) vocab[w] = id++;
  const tok = new hf.Tokenizer(hf.WordLevel.init(vocab, { unkToken: "<unk>" }));
  tok.setNormalizer(normalizer);
  tok.setPreTokenizer(pre);
  return tok;
}

const built = {
  "bert-uncased": buildBert(true),
  "bert-cased": buildBert(false),
  "unigram": buildUnigram(false),
  "unigram-bytes": buildUnigram(true),
  "wordpiece-mixed": buildBert(true, true),
  "unigram-first": buildUnigram(false, "first"),
  "unigram-precompiled": buildPrecompiledUnigram(),
  "word-level": buildWordLevel(),
};
for (const [name, tok] of Object.entries(built)) {
  tok.save(`${golden}/${name}.json`, false);
  console.log(`${golden}/${name}.json: ${tok.getVocabSize(true)} tokens`);
}

// split-behaviors.json: the WordLevel tokenizer with Split pre-tokenizers of every behavior, regex
// and literal patterns, and invert (the binding makes only literal Splits, so the JSON is edited).
{
  const json = JSON.parse(fs.readFileSync(`${golden}/word-level.json`, "utf8"));
  const split = (pattern, behavior, invert = false) => ({ type: "Split", pattern, behavior, invert });
  json.pre_tokenizer = { type: "Sequence", pretokenizers: [
    split({ Regex: "\\s+" }, "MergedWithPrevious"),
    split({ Regex: "[0-9]" }, "MergedWithNext"),
    split({ String: "-" }, "Contiguous"),
    split({ Regex: "\\p{Lu}" }, "MergedWithPrevious", true),
    split({ String: "." }, "Removed"),
    split({ Regex: "[,;]" }, "Isolated", true),
  ] };
  fs.writeFileSync(`${golden}/split-behaviors.json`, JSON.stringify(json));
  hf.Tokenizer.fromFile(`${golden}/split-behaviors.json`);  // Hugging Face reads it
  console.log(`${golden}/split-behaviors.json`);
}
