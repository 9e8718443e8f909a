#!/usr/bin/env python3
"""Reference side of model/tests/tokenizer_hf_test.cpp, run with the venv interpreter that has
Hugging Face `tokenizers` and `transformers` (they are references only, never a dependency).

  prepare OUT --source-dir SRC   train Qwen2-, Llama 3- and GPT-2-style byte-level BPE tokenizers
                                 on a corpus of the repository's sources plus generated Unicode
                                 and white-space text (no downloads), write them under OUT, and
                                 write OUT/reference.json: the test cases and what tokenizers
                                 makes of them (ids, decodes, pre-tokenizer pieces, NFC, a sweep
                                 of every code point through the split regex).
  check-written DIR              load a tokenizer written by KernelZero's trainer with tokenizers
                                 and with transformers' AutoTokenizer; encode DIR/cases.json and
                                 render DIR/chats.json; write DIR/hf_result.json.
  bench TOKENIZER_JSON TEXT      tokenizers' single-string encode throughput (MB/s).
  train-bench OUT --source-dir SRC [--vocab N]   a larger Qwen2-style vocabulary for benchmarks.
"""
import argparse
import json
import os
import random
import sys
import time
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SOURCE_SUFFIXES = (".cpp", ".h", ".py", ".md", ".toml", ".sh", ".cu", ".txt")
SKIP_DIRS = {".git", ".venv", "build", ".deps", ".whl", "__pycache__", "runs"}

# ---------------------------------------------------------------------------------------------
# Text


def source_files(src):
    files = []
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build"))
        for name in sorted(names):
            if name.endswith(SOURCE_SUFFIXES) and name != "unicode_tables.cpp":
                files.append(os.path.join(root, name))
    return files


def read_sources(src, limit_bytes):
    texts, total = [], 0
    for path in source_files(src):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


UNICODE_SAMPLES = [
    "深度学习模型在GPU上运行。矩阵乘法的内核需要优化。", "日本語のテキスト、カタカナとひらがな。",
    "한국어 문장입니다. 커널을 작성합니다.", "مرحبا بالعالم، هذا نص عربي.", "שָׁלוֹם עוֹלָם",
    "नमस्ते दुनिया, यह हिंदी है।", "สวัสดีชาวโลก", "Привет, мир! Ядро CUDA.", "Γειά σου Κόσμε",
    "Crème brûlée, naïve café, Ångström, Øresund, Łódź, İstanbul, straße",
    "emoji 😀👩‍💻🇫🇷👍🏽 ✨🔥 and symbols ∑∫√∞≈≠ €£¥ ©®™ ←→↔",
    "combining: e\u0301 a\u0328\u0301 o\u0308\u0304 \u1e9b\u0323 A\u030a \u212b \u1100\u1161\u11a8",
    "digits: 0123456789 ١٢٣٤٥ ۱۲۳ १२३ ² ³ ½ Ⅻ ① ⑽",
    "quotes: ‘single’ “double” «guillemets» — dash – en ‥ …",
]

PYTHON_SNIPPET = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Applies GELU then a 3x3 convolution."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.nn.functional.gelu(x))  # don't fuse yet


def get_inputs():
    return [torch.randn(16, 64, 128, 128)]
'''

CUDA_SNIPPET = '''#include <cuda_runtime.h>

extern "C" __global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}

\tvoid launch(const float* x, float* y, int n, cudaStream_t s) {
\t\tgelu_kernel<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);
\t}
'''

CPP_SNIPPET = ("template <class T>\r\nstd::vector<T> scale(const std::vector<T>& v, T k) {\r\n"
               "  std::vector<T> out; out.reserve(v.size());\r\n  for (auto x : v) out.push_back(x * k);\r\n"
               "  return out;  // it's fine, we'll see\r\n}\r\n")


def generated_text(rng, count):
    """Mixed code, Unicode and white space, for training and as extra test cases."""
    pool = UNICODE_SAMPLES + [PYTHON_SNIPPET, CUDA_SNIPPET, CPP_SNIPPET]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 4)):
            piece = rng.choice(pool)
            if rng.random() < 0.3:
                piece = piece.replace("    ", "\t")
            parts.append(piece)
            parts.append(rng.choice([" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "    ", ""]))
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        out.append("".join(parts))
    return out


# Characters the random cases draw from: every class the split regexes distinguish.
RANDOM_POOL = (list("abcXYZ'sStTreREvelLdDmM019_ -+=*/\\()[]{}<>;:,.!?\"#$%&|~`@^") +
               ["\t", "\n", "\r", "\r\n", "  ", "   ", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x85",
                "\u1680", "\u202f", "é", "e\u0301", "\u0301", "\u0327", "ß", "ﬁ", "ſ", "İ", "ǅ",
                "漢", "字", "ー", "가", "\u1100", "\u1161", "\u11a8", "ع", "\u064e", "٣", "५", "²", "½",
                "Ⅻ", "😀", "👩\u200d💻", "\u200d", "\ufeff", "\u200b", "🇫", "🇷", "€", "∑", "—", "…",
                "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<mask>", "kernelzero"])


def random_cases(rng, count):
    return ["".join(rng.choice(RANDOM_POOL) for _ in range(rng.randint(1, 40))) for _ in range(count)]


HAND_CASES = [
    "", " ", "a", "hello world", "Hello World!", "  leading", "trailing  ", "a  b   c    d",
    "I'm here, you're there, they've gone, he'll see, she'd know, it's 'quoted'",
    "I'M HERE, YOU'RE THERE, THEY'VE GONE, HE'LL SEE, SHE'D KNOW, IT'S, DON'T, Y'ALL'LL",
    "mIxEd 'Re 'rE 'Ve 'lL 'S 'T 'M 'D", "rock 'n' roll", "'s's't", "it\u2019s curly", "''", "x'",
    "\t", "\t\t\tindented", "x \n\n  y", "line1\r\nline2\r\n\r\n  line3", "\n\r\n\r", " \n", "\n ",
    "a \u00a0 b", "wide\u3000space", "ws\u2028sep\u2029para", "\x0b\x0c\x85\x1c\x1d",
    " " * 1000, "\n" * 300, "\t" * 50 + "x", "=" * 500, "a" * 3000, "7" * 500, "ab" * 700, "ÿ" * 200,
    "1234567890", "3.14159 2.71828e-10 0x1F 1_000_000", "१२३ ١٢٣ ۱۲۳ ² ³ ½ Ⅻ ①",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more", "<|im_start", "<|im_start|><|im_end|>", "<<|im_end|>>", "<|im_start|>|>",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "a   <mask>   b", "<mask><mask>", "x<mask>y",
    "kernelzero is kernelzero_x, KernelZero kernelzeros (kernelzero)",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|reserved_special_token_3|><|reserved_special_token_35|>",
    "e\u0301e\u0301\u0323 \u1e9b\u0323 \u212b \u2126 \u0958 \uac00\u11a8 \u1100\u1161\u11a8 \u0344 \u0f73",
    "\u0301leading mark", "a\u0315\u0300\u05ae\u0301b", "\u00c5\u0301 \u1e0b\u0323 q\u0307\u0323",
    PYTHON_SNIPPET, CUDA_SNIPPET, CPP_SNIPPET,
] + UNICODE_SAMPLES

# ---------------------------------------------------------------------------------------------
# Tokenizers


def train(tokenizer, corpus, vocab_size):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def qwen2_style(corpus, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, corpus, vocab_size)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    return json.loads(tok.to_str())


def llama3_style(corpus, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, corpus, vocab_size)
    data = json.loads(tok.to_str())
    # Whole-word tokens that no merge sequence reaches: only ignore_merges (Llama 3) emits them.
    vocab = data["model"]["vocab"]
    for word in ["ĠKernelZero", "Ġkernelzero", "kernelzero", "Ġkernelzeros", "ĠKERNEL", "ĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠ",
                 "ĊĊĊĊĊĊ", "Ġgelu_kernel", "ĠHello", "ĠWorld", "====", "ĠĠĠĠĠĠĠĠ", "Ġself", "Ġtorch"]:
        if word not in vocab:
            vocab[word] = len(vocab)
    data["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(data))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(40)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return json.loads(tok.to_str())


def gpt2_style(corpus, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, corpus, vocab_size)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                            AddedToken("<mask>", special=True, lstrip=True, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("kernelzero", special=False, single_word=True, normalized=True)])
    data = json.loads(tok.to_str())
    # The merges as "a b" strings, the format of tokenizers before 0.20 (many hub files).
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    return data


def gpt2_prefix_style(gpt2):
    data = json.loads(json.dumps(gpt2))
    data["pre_tokenizer"]["add_prefix_space"] = True
    return data


# ---------------------------------------------------------------------------------------------
# References


def encodings(tok, cases):
    out = {"special": [], "plain": []}
    for allow, key in ((True, "special"), (False, "plain")):
        tok.encode_special_tokens = not allow
        out[key] = [tok.encode(c, add_special_tokens=False).ids for c in cases]
    tok.encode_special_tokens = False
    return out


def decodes(tok, id_lists):
    return {"full": [tok.decode(ids, skip_special_tokens=False) for ids in id_lists],
            "skip": [tok.decode(ids, skip_special_tokens=True) for ids in id_lists]}


def pieces(tok, cases):
    out = []
    for c in cases:
        text = tok.normalizer.normalize_str(c) if tok.normalizer else c
        out.append([p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)])
    return out


def fnv1a(values):
    h = 0xcbf29ce484222325
    for v in values:
        h ^= v
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


SWEEP_BLOCK = 4096


def sweep_probe(cp):
    """Text around one code point whose pieces depend on whether it is \\p{L}, \\p{N}, \\s or other."""
    c = chr(cp)
    return c + "a" + c + "1" + c + c + "!" + c + " "


def sweep(pre_tokenizer):
    """Per block of code points: a hash of the byte lengths of the pieces of the block's probes."""
    hashes = []
    for first in range(0, 0x110000, SWEEP_BLOCK):
        text = "".join(sweep_probe(cp) for cp in range(first, first + SWEEP_BLOCK) if not 0xD800 <= cp <= 0xDFFF)
        hashes.append(fnv1a(len(p.encode("utf-8")) for p, _ in pre_tokenizer.pre_tokenize_str(text)))
    return hashes


def nfc_inputs(rng):
    """Every character that NFC touches, decomposed and in context, plus mark soups."""
    inputs, block = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if unicodedata.normalize("NFD", c) != c or unicodedata.combining(c):
            block.append("x" + unicodedata.normalize("NFD", c) + c)
            if len(block) == 200:
                inputs.append(" ".join(block))
                block = []
    inputs.append(" ".join(block))
    marks = [chr(c) for c in range(0x300, 0x370)] + ["\u0591", "\u05b0", "\u0610", "\u093c", "\u094d", "\u3099"]
    bases = ["a", "e", "o", "u", "A", "\u1100", "\uac00", "\u0915", "\u304b", "x"]
    for _ in range(300):
        inputs.append("".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4)))
                              for _ in range(rng.randint(1, 8))))
    return inputs


def prepare(out, source_dir):
    rng = random.Random(20261129)
    corpus = read_sources(source_dir, 700_000) + generated_text(rng, 400)
    styles = {"qwen2": qwen2_style(corpus, 3000), "llama3": llama3_style(corpus, 3000),
              "gpt2": gpt2_style(corpus, 2000)}
    styles["gpt2_prefix"] = gpt2_prefix_style(styles["gpt2"])
    cases = HAND_CASES + random_cases(rng, 300) + generated_text(rng, 40)
    cases += [t[i:i + 3000] for t in read_sources(source_dir, 150_000) for i in range(0, len(t), 3000)][:60]
    reference = {"cases": cases, "tokenizers": {}}
    for name, data in styles.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        path = os.path.join(out, name, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)
        enc = encodings(tok, cases)
        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        random_ids = [[rng.randrange(vocab_size + 50) for _ in range(rng.randint(1, 30))] for _ in range(300)]
        reference["tokenizers"][name] = {
            "path": path, "vocab_size": vocab_size, "encode": enc,
            "decode": decodes(tok, enc["special"]),
            "random_ids": random_ids, "random_decode": decodes(tok, random_ids),
            "pieces": pieces(tok, cases)}
    llama = Tokenizer.from_file(os.path.join(out, "llama3", "tokenizer.json"))
    gpt2 = Tokenizer.from_file(os.path.join(out, "gpt2", "tokenizer.json"))
    reference["sweep"] = {"block": SWEEP_BLOCK, "llama3": sweep(llama.pre_tokenizer), "gpt2": sweep(gpt2.pre_tokenizer)}
    nfc = normalizers.NFC()
    inputs = nfc_inputs(rng)
    reference["nfc"] = {"inputs": inputs, "outputs": [nfc.normalize_str(s) for s in inputs]}
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False)


def check_written(directory):
    from transformers import AutoTokenizer  # slow import: only here
    with open(os.path.join(directory, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    with open(os.path.join(directory, "chats.json"), encoding="utf-8") as f:
        chats = json.load(f)
    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(directory)
    result = {
        "tokenizers": [tok.encode(c, add_special_tokens=False).ids for c in cases],
        "transformers": [auto.encode(c, add_special_tokens=False) for c in cases],
        "decode": [tok.decode(tok.encode(c, add_special_tokens=False).ids, skip_special_tokens=False) for c in cases],
        "chats": [auto.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["add_generation_prompt"])
                  for c in chats],
        "eos_token_id": auto.eos_token_id, "pad_token_id": auto.pad_token_id, "bos_token_id": auto.bos_token_id,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }
    with open(os.path.join(directory, "hf_result.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)


def bench(tokenizer_json, text_file, repeats=3):
    """Single-string encode (what kz_tokenizer_bench measures), the same text in 64 KB chunks
    one after another, and encode_batch over the chunks on every core."""
    tok = Tokenizer.from_file(tokenizer_json)
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    mb = len(text.encode("utf-8")) / 1e6
    chunks, start = [], 0
    while start < len(text):  # cut at line ends so chunking changes no piece
        end = text.find("\n", start + 65536)
        end = len(text) if end < 0 else end + 1
        chunks.append(text[start:end])
        start = end
    ids = []
    for r in range(repeats):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        s = time.perf_counter() - t0
        print(f"tokenizers one string run {r}: {mb:.2f} MB in {s:.3f} s = {mb / s:.1f} MB/s, {len(ids)} tokens")
    print(f"ids fnv1a {fnv1a(ids):016x}")
    t0 = time.perf_counter()
    n = sum(len(tok.encode(c, add_special_tokens=False).ids) for c in chunks)
    s = time.perf_counter() - t0
    print(f"tokenizers {len(chunks)} chunks, one thread: {mb / s:.1f} MB/s, {n} tokens")
    t0 = time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(chunks, add_special_tokens=False))
    s = time.perf_counter() - t0
    print(f"tokenizers encode_batch, {os.cpu_count()} cores: {mb / s:.1f} MB/s, {n} tokens")


def train_bench(out, source_dir, vocab):
    rng = random.Random(7)
    corpus = read_sources(source_dir, 50_000_000) + generated_text(rng, 2000)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(qwen2_style(corpus, vocab), f, ensure_ascii=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out")
    p.add_argument("--source-dir", required=True)
    p = sub.add_parser("check-written")
    p.add_argument("dir")
    p = sub.add_parser("bench")
    p.add_argument("tokenizer_json")
    p.add_argument("text")
    p = sub.add_parser("train-bench")
    p.add_argument("out")
    p.add_argument("--source-dir", required=True)
    p.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.out, args.source_dir)
    elif args.command == "check-written":
        check_written(args.dir)
    elif args.command == "bench":
        bench(args.tokenizer_json, args.text)
    else:
        train_bench(args.out, args.source_dir, args.vocab)


if __name__ == "__main__":
    sys.exit(main())
