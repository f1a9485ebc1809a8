"""Helper of bench/bpe_encode_check.sh (a throwaway virtual environment with the
`tokenizers` and `h5py` packages; not part of the product or its tests).

  train CORPUS.jsonl DIR VOCAB    trains a byte-level BPE of VOCAB tokens with
                                  LLaMA-3's pre-tokenizer on CORPUS's texts and
                                  writes DIR/tokenizer.json and tokenizer_config.json
  encode DIR CORPUS.jsonl OUT.npy encodes every text as the library does (BOS added
                                  by the post-processor, EOS appended as the trainer
                                  does), all cores, and prints the seconds it took
  compare OURS.h5 THEIRS.npy      compares the trainer's dataset with those ids
"""
import json
import sys
import time


# LLaMA-3's pre-tokenizer regex, as its tokenizer.json writes it.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def texts(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def train(corpus, out_dir, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(254)]
    trainer = trainers.BpeTrainer(vocab_size=int(vocab), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(corpus), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.save(f"{out_dir}/tokenizer.json")
    with open(f"{out_dir}/tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)


def encode(tok_dir, corpus, out):
    import numpy as np
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(f"{tok_dir}/tokenizer.json")
    eos = tok.token_to_id("<|end_of_text|>")
    docs = list(texts(corpus))
    start = time.perf_counter()
    encodings = tok.encode_batch_fast(docs) if hasattr(tok, "encode_batch_fast") else tok.encode_batch(docs)
    seconds = time.perf_counter() - start
    ids = np.concatenate([np.array(e.ids + [eos], dtype=np.uint32) for e in encodings])
    np.save(out, ids)
    print(f"{seconds:.3f}")


def compare(ours_h5, theirs_npy):
    import h5py
    import numpy as np
    ours = h5py.File(ours_h5, "r")["tokens"][:]
    theirs = np.load(theirs_npy)
    if ours.shape == theirs.shape and (ours == theirs).all():
        print(f"identical: {len(ours)} ids")
        return 0
    n = min(len(ours), len(theirs))
    first = int(np.argmax(ours[:n] != theirs[:n])) if (ours[:n] != theirs[:n]).any() else n
    print(f"DIFFERENT: {len(ours)} ids against {len(theirs)}; first difference at {first}: "
          f"ours {ours[first:first + 8].tolist()} theirs {theirs[first:first + 8].tolist()}")
    return 1


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "train":
        train(*args)
    elif command == "encode":
        encode(*args)
    elif command == "compare":
        sys.exit(compare(*args))
    else:
        sys.exit(f"unknown command {command}")
