"""Independent DFlash reference (straight from DFLASH.md §3-4, dense mask, float64).

Run with /usr/bin/python3 (Debian python3-torch). Writes one parity case into a folder:
  drafter.json      HF-style drafter config (DFLASH.md §6)
  w.safetensors     drafter weights with HF names + embed_tokens.weight (+ lm_head.weight unless tied)
  b.safetensors     input_ids [b,S] i64, loss_mask [b,S] u8, hidden_states [b,S,n*H] f32, anchors [b,N] i64
  ref.safetensors   loss, slot_accuracy [B-1], and the gradient of every trainable parameter

usage: dflash_reference.py OUT_DIR --seed S --block-size B --layers L --heads NH --kv-heads KV
                           [--tied] [--batch b] [--seq S] [--anchors N] [--gamma G]
                           [--layer-types s,f,...] [--sliding-window W] [--ce-weight A]
"""
import argparse
import json
import math
import os
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.uint8: "U8"}
FROM_NAME = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool,
             "I32": torch.int32, "BF16": torch.bfloat16, "F16": torch.float16}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(body[b:en]) or bytearray(1),
                                     dtype=FROM_NAME[e["dtype"]])[:math.prod(e["shape"])].reshape(e["shape"])
    return out


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """x [heads, T, hd]; pos [T] absolute positions (HF Llama/Qwen convention)."""
    hd = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * emb.cos() + rotated * emb.sin()


def drafter_loss(cfg, p, frozen, batch, gamma, ce_weight=1.0):
    """Returns (loss, slot_correct [B-1], slot_total [B-1], kl) over the whole batch.

    Each predicted position's loss is ce_weight * CE + (1 - ce_weight) * KL(p_target || p_drafter),
    p_target = softmax(teacher_hidden[a + k - 1] @ lm_head.T); kl is sum(w * KL) / sum(w).
    """
    H, B = cfg["hidden_size"], cfg["block_size"]
    nh, kvh, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    mask_id = cfg["dflash_config"]["mask_token_id"]
    embed, lm_head = frozen
    ids_all, lm_all = batch["input_ids"], batch["loss_mask"].to(torch.float64)
    feats_all, anchors_all = batch["hidden_states"].to(torch.float64), batch["anchors"]
    bsz, S = ids_all.shape
    N = anchors_all.shape[1]
    total_wce = torch.zeros((), dtype=torch.float64)
    total_w = torch.zeros((), dtype=torch.float64)
    total_kl = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros(B - 1, dtype=torch.float64)
    count = torch.zeros(B - 1, dtype=torch.float64)
    for s in range(bsz):
        ids, lm, anchors = ids_all[s], lm_all[s], anchors_all[s]
        keep = anchors >= 0
        a = anchors.clamp(min=0)
        ctx = rmsnorm(feats_all[s] @ p["fc.weight"].T, p["hidden_norm.weight"], eps)  # [S, H]
        block_ids = torch.full((N, B), mask_id, dtype=torch.int64)
        block_ids[:, 0] = ids[a]
        x = embed[block_ids.reshape(-1)]  # [N*B, H]
        pos_q = (a[:, None] + torch.arange(B)[None, :]).reshape(-1)
        pos_k = torch.cat([torch.arange(S), pos_q])
        # allow[q, kv]: query q in block j = q // B
        j = torch.arange(N * B) // B
        kv = torch.arange(S + N * B)
        ctx_ok = (kv[None, :] < S) & (kv[None, :] < a[j][:, None])
        blk_ok = (kv[None, :] >= S) & (((kv[None, :] - S) // B) == j[:, None])
        allow_full = keep[j][:, None] & (ctx_ok | blk_ok)
        # A sliding layer (SpecForge's rule): the query at position a + t sees context positions
        # >= a + t - (W - 1) and its block's slots <= t.
        t = torch.arange(N * B) % B
        W = cfg.get("sliding_window") or 0
        ctx_win = ctx_ok & (kv[None, :] >= (a[j] + t - (W - 1))[:, None])
        blk_causal = blk_ok & (((kv[None, :] - S) % B) <= t[:, None])
        allow_sliding = keep[j][:, None] & (ctx_win | blk_causal)
        layer_types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
        for i in range(cfg["num_hidden_layers"]):
            allow = allow_sliding if layer_types[i] == "sliding_attention" else allow_full
            pre = f"layers.{i}."
            xn = rmsnorm(x, p[pre + "input_layernorm.weight"], eps)
            q = (xn @ p[pre + "self_attn.q_proj.weight"].T).view(N * B, nh, hd)
            q = rmsnorm(q, p[pre + "self_attn.q_norm.weight"], eps).transpose(0, 1)
            kin = torch.cat([ctx, xn])  # the context skips input_layernorm
            k = (kin @ p[pre + "self_attn.k_proj.weight"].T).view(-1, kvh, hd)
            k = rmsnorm(k, p[pre + "self_attn.k_norm.weight"], eps).transpose(0, 1)
            v = (kin @ p[pre + "self_attn.v_proj.weight"].T).view(-1, kvh, hd).transpose(0, 1)
            q, k = rope(q, pos_q, theta), rope(k, pos_k, theta)
            k = k.repeat_interleave(nh // kvh, dim=0)
            v = v.repeat_interleave(nh // kvh, dim=0)
            scores = (q @ k.transpose(1, 2)) / math.sqrt(hd)
            scores = scores.masked_fill(~allow[None], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            probs = torch.where(allow[None], probs, torch.zeros_like(probs))  # NaN rows -> 0
            attn = (probs @ v).transpose(0, 1).reshape(N * B, nh * hd)
            x = x + attn @ p[pre + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], eps)
            gate = h @ p[pre + "mlp.gate_proj.weight"].T
            up = h @ p[pre + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ p[pre + "mlp.down_proj.weight"].T
        logits = rmsnorm(x, p["norm.weight"], eps) @ lm_head.T  # [N*B, V]
        logits = logits.view(N, B, -1)
        for k_slot in range(1, B):
            tgt = a + k_slot
            valid = (tgt < S) & keep
            tgt_c = tgt.clamp(max=S - 1)
            labels = ids[tgt_c]
            m = valid.to(torch.float64) * lm[tgt_c]
            w = m * math.exp(-(k_slot - 1) / gamma)
            ce = torch.nn.functional.cross_entropy(logits[:, k_slot], labels, reduction="none")
            per_row = ce
            if ce_weight < 1.0:
                teacher = batch["teacher_hidden"][s].to(torch.float64)[tgt_c - 1] @ lm_head.T
                log_pt = torch.log_softmax(teacher, -1)
                log_ps = torch.log_softmax(logits[:, k_slot], -1)
                kl = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
                per_row = ce_weight * ce + (1.0 - ce_weight) * kl
                total_kl = total_kl + (w * kl).sum().detach()
            total_wce = total_wce + (w * per_row).sum()
            total_w = total_w + w.sum()
            hit = (logits[:, k_slot].argmax(-1) == labels).to(torch.float64)
            correct[k_slot - 1] += (hit * m).sum().detach()
            count[k_slot - 1] += m.sum()
    loss = total_wce / total_w if total_w > 0 else total_wce * 0
    kl = total_kl / total_w if total_w > 0 else total_kl
    return loss, correct, count, kl


def make_case(args):
    g = torch.Generator().manual_seed(args.seed)
    H, nh, kvh = 32, args.heads, args.kv_heads
    hd, inter, V, n_feat, B = 8, 48, 97, 3, args.block_size
    mask_id = V - 1  # inside the table, never a real token here
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": B,
        "num_hidden_layers": args.layers, "num_target_layers": 12, "hidden_size": H,
        "intermediate_size": inter, "num_attention_heads": nh, "num_key_value_heads": kvh,
        "head_dim": hd, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V,
        "max_position_embeddings": 4096, "tie_word_embeddings": bool(args.tied),
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": [1, 5, 9]},
    }
    if args.layer_types:
        names = {"f": "full_attention", "s": "sliding_attention"}
        cfg["layer_types"] = [names[x] for x in args.layer_types.split(",")]
        assert len(cfg["layer_types"]) == args.layers
        cfg["use_sliding_window"] = True
        cfg["sliding_window"] = args.sliding_window
    f64 = dict(dtype=torch.float64)

    def randn(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g, **f64) * scale)

    def norm_w(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g, **f64)

    p = {"fc.weight": randn(H, n_feat * H), "hidden_norm.weight": norm_w(H), "norm.weight": norm_w(H)}
    for i in range(args.layers):
        pre = f"layers.{i}."
        p[pre + "input_layernorm.weight"] = norm_w(H)
        p[pre + "post_attention_layernorm.weight"] = norm_w(H)
        p[pre + "self_attn.q_proj.weight"] = randn(nh * hd, H)
        p[pre + "self_attn.k_proj.weight"] = randn(kvh * hd, H)
        p[pre + "self_attn.v_proj.weight"] = randn(kvh * hd, H)
        p[pre + "self_attn.o_proj.weight"] = randn(H, nh * hd)
        p[pre + "self_attn.q_norm.weight"] = norm_w(hd)
        p[pre + "self_attn.k_norm.weight"] = norm_w(hd)
        p[pre + "mlp.gate_proj.weight"] = randn(inter, H)
        p[pre + "mlp.up_proj.weight"] = randn(inter, H)
        p[pre + "mlp.down_proj.weight"] = randn(H, inter)
    # Round every weight to float32 first: the C++ side reads float32, both must start equal.
    p = {k: v.float().double() for k, v in p.items()}
    embed = randn(V, H, scale=1.0).float().double()
    lm_head = embed if args.tied else randn(V, H, scale=1.0).float().double()

    bsz, S, N = args.batch, args.seq, args.anchors
    ids = torch.randint(0, V - 1, (bsz, S), generator=g)
    loss_mask = torch.zeros(bsz, S, dtype=torch.uint8)
    anchors = torch.full((bsz, N), -1, dtype=torch.int64)
    for s in range(bsz):
        length = S - 5 * s  # right padding on later samples
        ids[s, length:] = 0
        prompt = 2 + s
        loss_mask[s, prompt:length] = 1
        cand = [i for i in range(S - 1) if loss_mask[s, i] and loss_mask[s, i + 1]]
        pick = torch.randperm(len(cand), generator=g)[: max(0, min(N - s, len(cand)))]
        chosen = sorted(cand[i] for i in pick.tolist())
        anchors[s, : len(chosen)] = torch.tensor(chosen, dtype=torch.int64)
    feats = randn(bsz, S, n_feat * H, scale=1.0).float()
    batch = {"input_ids": ids, "loss_mask": loss_mask, "hidden_states": feats, "anchors": anchors}
    if args.ce_weight < 1.0:  # the target's final-normed last hidden state, per position
        batch["teacher_hidden"] = randn(bsz, S, H, scale=1.0).float()

    params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    gamma = args.gamma if args.gamma else {16: 7.0, 10: 5.0, 8: 4.0}[B]
    loss, correct, count, kl = drafter_loss(cfg, params, (embed, lm_head), batch, gamma,
                                            args.ce_weight)
    loss.backward()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "drafter.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    weights = {k: v.float() for k, v in p.items()}
    weights["embed_tokens.weight"] = embed.float()
    if not args.tied:
        weights["lm_head.weight"] = lm_head.float()
    write_safetensors(os.path.join(args.out, "w.safetensors"), weights)
    write_safetensors(os.path.join(args.out, "b.safetensors"), batch)
    acc = torch.where(count > 0, correct / count.clamp(min=1), torch.zeros_like(count))
    ref = {"loss": loss.detach().float().reshape(()), "slot_accuracy": acc.float()}
    if args.ce_weight < 1.0:
        ref["kl"] = kl.float().reshape(())
    for k, v in params.items():
        ref[k] = v.grad.float()
    write_safetensors(os.path.join(args.out, "ref.safetensors"), ref)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=40)
    ap.add_argument("--anchors", type=int, default=6)
    ap.add_argument("--gamma", type=float, default=0.0)
    ap.add_argument("--layer-types", default="", help="per layer f (full) or s (sliding): s,f")
    ap.add_argument("--sliding-window", type=int, default=0)
    ap.add_argument("--ce-weight", type=float, default=1.0,
                    help="alpha of alpha*CE + (1-alpha)*KL; below 1 the batch gets teacher_hidden")
    make_case(ap.parse_args())
