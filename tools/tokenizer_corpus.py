#!/usr/bin/env python3
"""Writes tests/golden/tokenizer/corpus.jsonl: strings that exercise every part of a tokenizer.

Deterministic (fixed seed). One JSON string per line. Run from the repository root:
  python3 tools/tokenizer_corpus.py
"""
import json
import random
import unicodedata

rng = random.Random(1234)
out = []

languages = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we've seen what you'd do. DON'T WON'T I'LL",
    "Voilà l'été: où est le cœur? Ça alors, à bientôt!",
    "Größenwahn ist keine Straßenbahn; Äpfel, Öl und Übermut.",
    "¿Dónde está la biblioteca? ¡Mañana será otro día, señor!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم، كيف حالك اليوم؟ ١٢٣٤٥",
    "שלום עולם, מה שלומך היום?",
    "नमस्ते दुनिया, आप कैसे हैं? क्षत्रिय",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "你好，世界！今天天气很好。我们去公园吧。",
    "日本語のテキスト：ひらがな、カタカナ、漢字。ｶﾀｶﾅ半角",
    "안녕하세요 세계! 한국어 텍스트입니다.",
    "Tiếng Việt có nhiều dấu: ồ, ạ, ữ, ẫ, ỹ.",
    "Türkçe: İstanbul, ığdır, şeker, çiçek, ğ.",
    "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża.",
    "Ελληνικά και English mixed με 123 numbers.",
    "ქართული ენა, Հայերեն լեզու, ᎠᏂᏴᏫᏯ",
    "தமிழ் மொழி, తెలుగు భాష, ಕನ್ನಡ, മലയാളം, বাংলা",
    "ᚠᚢᚦᚨᚱᚲ runes and 𐌰𐌱𐌲 gothic and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "Ñandú, ﬁ ligature, ẞ capital sharp s, ǅ titlecase, ſ long s's",
    "Kelvin K and Angstrom Å signs, ℌ, ℵ, Ⅻ roman numerals, ½ ¼ ²³",
]
emoji = [
    "I love pizza 🍕 and tacos 🌮!",
    "👍🏽 thumbs up with skin tone, 👋🏿 wave",
    "Family: 👨‍👩‍👧‍👦 and couple 👩‍❤️‍💋‍👨 and 🏳️‍🌈 flag",
    "Flags: 🇺🇸🇫🇷🇯🇵🇩🇪 and keycaps 1️⃣ #️⃣",
    "🧑🏻‍💻 technologist, 🤷‍♀️ shrug, ❤️ heart, ☺︎ text style",
    "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇",
    "emoji🙂inside😀words",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence",
]
combining = [
    "e\u0301 vs \u00e9",
    "A\u030a vs \u00c5 vs \u212b",
    "n\u0303o vs \u00f1o",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u1100\u1161\u11a8 conjoining jamo",
    "q\u0307\u0323 d\u0323\u0307 ordering of marks",
    "\u0915\u093c \u0929 nukta",
    "\u05e9\u05c1\u05b8 hebrew points",
]
whitespace = [
    "  leading spaces", "trailing spaces   ", "   ", " ", "\n", "\n\n\n", "\t", "\t\t\tindented",
    "a\tb\tc", "line1\r\nline2\r\n", "\r\n\r\n", "\r", "mixed \t \n \r\n end",
    "many          spaces          here", "new\n\n\n\nlines", " \n \n ", "end with newline\n",
    "\u00a0non-breaking\u00a0space", "ideographic\u3000space", "em\u2003space thin\u2009space",
    "zero\u200bwidth\u200cjoiner\u200dtest", "\ufeffBOM at start", "line\u2028sep\u2029para",
    "vertical\x0btab\x0cformfeed", "next\u0085line", "ogham\u1680space", "\u180emongolian",
    "    def f():\n        return 1\n", "x  \n  y", "a \u00a0 b",
]
code = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"hello, %s\\n\", \"world\");\n\treturn 0;\n}\n",
    "const x = arr.map((v, i) => v * 2).filter(Boolean); // comment",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log.txt 2>&1",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", x); Ok(()) }",
    "x += 1; y -= 2; z *= 3; w /= 4; q %= 5; a <<= 1; b >>= 2; c ||= d",
    "if __name__ == '__main__':\n\tmain()\r\n",
    "    \n    \n\tpass",
    "a=b+c-d*e/f%g^h&i|j~k!l?m:n;o,p.q",
    "```python\nprint('x')\n```",
    "// TODO(someone): fix this!!! ??? ... ---- ==== ****",
]
numbers = [
    "123", "1234567890", "3.14159265358979323846264338327950288419716939937510",
    "The year 2024 had 366 days; 1,000,000 people; 0.001%.", "+1 (555) 123-4567",
    "12345678901234567890123456789012345678901234567890", "0x1F600 0b1010 0o777 1e-9 6.02e23",
    "v1.2.3-beta.4+build.567", "٣٤٥ ۱۲۳ १२३ ๑๒๓ ১২৩", "①②③ ⑴⑵ ¹²³ ₁₂₃", "$1,234.56 €99,99 ¥1000 £5",
    "2024-01-15T10:30:00Z", "192.168.0.1:8080", "Room 101, 221B Baker St.",
]
urls = [
    "https://www.example.com/path/to/page?query=1&other=two#section",
    "Visit http://localhost:8000/api/v1/users/42 for details.",
    "mailto:someone@example.org, ftp://files.example.net/pub/file.tar.gz",
    "https://zh.wikipedia.org/wiki/中文 and https://example.com/%E2%9C%93",
    "git@github.com:owner/repo.git",
]
special = [
    "<|endoftext|>", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more", "<|im_start|><|im_start|><|im_end|>", "< |im_start| >", "<|im_start",
    "<|begin_of_text|>Hello<|end_of_text|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<think>\nreasoning here\n</think>\n\nanswer", "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<s>[INST] hi [/INST]</s>", "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<pad><eos><unk><mask>", "[CLS] [SEP] [PAD] [MASK] [UNK]", "<unused0><unused99>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "  <|im_end|>  ", "\n<|endoftext|>\n",
    "<|endoftext|><|endoftext|>", "<|im_end|>.<|im_end|>", "<<|im_start|>>", "<|reserved_special_token_5|>",
    "<|eot_id|><|eom_id|><|python_tag|>", "<start_of_image> <end_of_image>",
    "<0x41><0x0A>", "▁leading▁meta", "##suffix ##ing", "<flag_l>", "x   <flag_l>   y", "a <flag_r>   b",
    "word words sword word.", "a word_b", "hello world", "Hello World hello  world", "  <flag_lr>  z",
    "\u00e9t\u00e9 <nfc_tok> e\u0301t\u00e9", "Ωmega ohm\u2126",
]
misc = [
    "", "a", "A", "!", "?!", "...", "—", "–-", "\"quoted\" 'single' `back`", "«guillemets» „low” ‹›",
    "(parens) [brackets] {braces} <angles>", "@user #hashtag $money %pct ^caret &amp *star",
    "don't DON'T Don't don’t it’s", "'s 't 're 've 'm 'll 'd", "X's Y'S 'T 'Re",
    "CamelCaseWordsLikeThis and snake_case_words and kebab-case-words",
    "ALL CAPS SHOUTING TEXT", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abababababababababababababababab", "............................................",
    "!!!!!!!!!!??????????", "=================================================",
    "\\\\\\\\ backslashes \\n \\t", "\x00 nul and \x01 control \x1f chars \x7f del",
    "\u0080\u009f C1 controls", "\ufffd replacement char", "\U0010ffff max code point", "\ue000 private use",
    "Mr. Smith went to Washington, D.C., on Jan. 5th.", "e.g., i.e., etc., vs.",
    "Hello, world!", "hello world", "Hello", " Hello", "HELLO", "hELLO",
]

out += languages + emoji + combining + whitespace + code + numbers + urls + special + misc

# NFC/NFD/NFKC pairs of text with accents.
for s in ["café résumé naïve", "Ångström Ñuñoa", "Việt Nam", "한국어", "がぎぐげご パピプペポ",
          "ﬁancé ﬀ ﬃ", "Å Ω K ℃ ㎏", "ḍ̇ ṩ ǖ"]:
  for form in ["NFC", "NFD", "NFKC", "NFKD"]:
    out.append(unicodedata.normalize(form, s))

# Held-out documents of the shipped model, cut at varying lengths.
with open("models/tiny-chat/heldout.jsonl") as f:
  docs = [json.loads(l)["text"] for l in f]
for i, d in enumerate(docs[:160]):
  n = rng.choice([40, 80, 200, 500, 1200])
  start = rng.randrange(0, max(1, len(d) - n))
  out.append(d[start:start + n])

# Random mixtures of the pieces above with random separators.
pool = languages + emoji + combining + whitespace + code + numbers + urls + special + misc
seps = ["", " ", "  ", "\n", "\t", "\r\n", " \n", "\u3000", ". ", ", "]
for i in range(150):
  k = rng.randint(2, 5)
  out.append(rng.choice(seps).join(rng.choice(pool) for _ in range(k)))

# Random code points from many blocks (valid scalar values only).
blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
          (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x3000, 0x30ff),
          (0x4e00, 0x4fff), (0xac00, 0xacff), (0xfe00, 0xfe0f), (0xff00, 0xffef), (0x1f300, 0x1f6ff),
          (0x1f900, 0x1f9ff), (0x10000, 0x1007f), (0xe0020, 0xe007f)]
for i in range(60):
  n = rng.randint(1, 24)
  chars = []
  for _ in range(n):
    lo, hi = rng.choice(blocks)
    chars.append(chr(rng.randint(lo, hi)))
  out.append("".join(chars))

with open("tests/golden/tokenizer/corpus.jsonl", "w") as f:
  for s in out:
    f.write(json.dumps(s, ensure_ascii=False) + "\n")
print(len(out), "strings")
