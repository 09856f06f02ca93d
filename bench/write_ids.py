"""Writes input_ids [1, S] (int64, a deterministic pattern below `vocab`) as a safetensors file
for `flashdraft debug target-features`: bench/write_ids.py OUT S VOCAB (no third-party modules)."""
import json
import struct
import sys

out, s, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ids = [(i * 7919 + 13) % vocab for i in range(s)]
header = json.dumps({"input_ids": {"dtype": "I64", "shape": [1, s],
                                   "data_offsets": [0, 8 * s]}}).encode()
header += b" " * (-len(header) % 8)
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + struct.pack(f"<{s}q", *ids))
