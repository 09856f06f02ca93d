"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/): one small valid input of each
form a parser accepts, so that libFuzzer starts from inputs that go deep. Run from anywhere:
  python3 tests/fuzz/make_seeds.py
Regression inputs (a finding, once fixed) go into the same folders under their own names.
"""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, wire, payload):
    return varint(num << 3 | wire) + payload


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


# TensorChunk: name, dtype U8 (7), shape [4], total_bytes 4, offset 0, chunk 0 of 1, crc, data.
data = b"\x01\x02\x03\x04"
chunk = (field(1, 2, varint(1) + b"x") + field(2, 0, varint(7)) + field(3, 2, varint(1) + varint(4))
         + field(4, 0, varint(4)) + field(5, 0, varint(0)) + field(6, 0, varint(0))
         + field(7, 0, varint(1)) + field(8, 5, struct.pack("<I", crc32c(data)))
         + field(15, 2, varint(len(data)) + data))
put("tensor_chunk", "chunk.bin", chunk)
put("tensor_chunk", "in_coordinator_message.bin", field(4, 2, varint(len(chunk)) + chunk))

# safetensors: two F32 tensors and metadata.
header = json.dumps({"__metadata__": {"format": "pt"},
                     "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [1, 1], "data_offsets": [8, 12]}}).encode()
put("safetensors", "two.safetensors",
    struct.pack("<Q", len(header)) + header + struct.pack("<3f", 1.0, 2.0, 3.0))

# Job files.
with open(os.path.join(HERE, "..", "..", "deploy", "examples", "synthetic.yaml")) as f:
    put("job_config", "synthetic.yaml", f.read())
put("job_config", "secure.yaml",
    "data: {shards_dir: /d}\ncluster: {listen: '0.0.0.0:7600'}\n"
    "security: {tls_cert: c.pem, tls_key: c.key, tls_ca: ca.pem, token_file: t}\n")

# checkpoint.json matching the fuzzer's files ("12345678{}" each).
crc = crc32c(b"12345678{}")
put("checkpoint", "checkpoint.json", json.dumps({
    "format": 1, "completed_steps": 1, "job": "0123abcd",
    "files": {"model.safetensors": crc, "optimizer.safetensors": crc}}))
# ... and a "numerics" record as the coordinator writes it (parsed by a resume).
env = {"torch": "1.13.0", "torch_build": "cpu, AVX2", "blas": "OpenBLAS 0.3.21",
       "blas_core": "Haswell", "device": "cpu", "gpu": "", "blas_threads": 1, "blas_env": [],
       "cpu": ""}
put("checkpoint", "numerics.json", json.dumps({
    "coordinator": dict(env, blas_core="Zen", blas_env=["OPENBLAS_CORETYPE=Zen"]),
    "workers": env, "mixed": False, "precision": "fp32", "intra_op_threads": 1}))


def byte_level_char(b):
    # GPT-2's byte -> printable character map.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    if b in printable:
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if x not in printable))


vocab = {byte_level_char(b): b for b in range(256)}
merges = [("l", "l"), ("h", "e"), ("he", "ll"), ("hell", "o"), (byte_level_char(32), "w")]
for a, b in merges:
    vocab.setdefault(a + b, len(vocab))
pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
put("tokenizer", "tiny.json", json.dumps({
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
    "model": {"type": "BPE", "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    "added_tokens": [{"id": 1000, "content": "<|im_start|>", "special": True},
                     {"id": 1001, "content": "<|im_end|>", "special": True}]}, ensure_ascii=False))

# Chat lines.
put("chat_line", "openai.jsonl", json.dumps({"messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"}]}))
put("chat_line", "sharegpt.jsonl", json.dumps({"conversations": [
    {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}))
put("chat_line", "tokenized.jsonl", json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}))

# A feeder's FeedMessage: ShardWork (ticket, Microbatch header of step 3, shard 0 of 1, one sample
# of 10 ids with 8 kept, a loss mask of 8 and anchors 0 and 4); a release; a FetchShardRequest.
def message(num, payload):
    return field(num, 2, varint(len(payload)) + payload)


ids = b"".join(varint(i) for i in range(1, 11))
sample = (field(1, 0, varint(0)) + message(2, ids) + message(3, b"\x01" * 8) + field(4, 0, varint(8))
          + message(5, varint(0) + varint(4)))
header = field(1, 0, varint(3)) + field(6, 0, varint(3)) + field(8, 0, varint(0)) + field(9, 0, varint(1))
work = message(1, b"t-3-0") + message(2, header) + message(3, sample)
put("feed_message", "work.bin", message(1, work))
put("feed_message", "release.bin", message(2, field(1, 0, varint(4))))
put("feed_message", "fetch.bin", message(1, b"t-3-0") + field(2, 0, varint(3)))
# ... and a feeder's answer to the coordinator: a FeederMessage (session token) with a regenerated
# line 7 of 3 tokens and its mask.
answer = field(1, 0, varint(7)) + message(2, varint(5) + varint(6) + varint(7)) + message(3, b"\x00\x01\x01")
put("feed_message", "regenerated.bin", message(2, b"tok") + message(5, answer))
