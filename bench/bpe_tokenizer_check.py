"""The tokenizer.json encoder against Hugging Face's tokenizers library (which the tests
may not use), for bench/bpe_tokenizer_check.sh:
  prepare DIR TEXT        a byte-level BPE of 8000 tokens with LLaMA-3's pre-tokenizer regex
                          trained on TEXT (DIR/tokenizer.json, DIR/tokenizer_config.json), and
                          the inputs: DIR/long.txt (TEXT 8 times, one document) and
                          DIR/docs.jsonl (TEXT's paragraphs 8 times, one document each)
  compare DIR INPUT DATA  encodes INPUT (a plain file: one document; .jsonl: one per line) with
                          the library, prints its time, and whether DATA.h5 holds the same ids
                          (BOS + ids + EOS per document)"""
import json
import sys
import time

import h5py
import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

if sys.argv[1] == "prepare":
    out, text = sys.argv[2], sys.argv[3]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train([text], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>", "<|begin|>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.save(f"{out}/tokenizer.json")
    with open(f"{out}/tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<|begin|>", "eos_token": "<|endoftext|>"}, f)
    with open(text, encoding="utf-8") as f:
        whole = f.read()
    with open(f"{out}/long.txt", "w", encoding="utf-8") as f:
        f.write(whole * 8)
    with open(f"{out}/docs.jsonl", "w", encoding="utf-8") as f:
        for _ in range(8):
            for paragraph in whole.split("\n\n"):
                if paragraph.strip():
                    f.write(json.dumps({"text": paragraph}) + "\n")
else:
    out, source, data = sys.argv[2], sys.argv[3], sys.argv[4]
    tok = Tokenizer.from_file(f"{out}/tokenizer.json")
    if source.endswith(".jsonl"):
        with open(source, encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f if line.strip()]
    else:
        with open(source, encoding="utf-8") as f:
            docs = [f.read()]
    start = time.time()
    encoded = tok.encode_batch(docs)  # the library's threads over documents
    seconds = time.time() - start
    with h5py.File(data) as h5:
        tokens, offsets = h5["tokens"][...], h5["doc_offsets"][...]
    bos, eos = tok.token_to_id("<|begin|>"), tok.token_to_id("<|endoftext|>")
    same = len(offsets) == len(docs) + 1 and all(
        np.array_equal(tokens[offsets[d]:offsets[d + 1]], np.array([bos] + e.ids + [eos]))
        for d, e in enumerate(encoded))
    print(f"tokenizers {seconds:.2f} s, {sum(len(e.ids) for e in encoded)} ids; trainer's ids "
          f"{'equal' if same else 'DIFFER'}")
    sys.exit(0 if same else 1)
