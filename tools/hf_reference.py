#!/usr/bin/python3
"""hf_reference.py - an independent PyTorch implementation of Hugging Face transformers' BLOOM and Falcon
blocks (the semantics of BloomForCausalLM and FalconForCausalLM, eager attention), written from the model
definitions' behaviour, not copied. It makes the golden files sepal checks itself against for the variants
transformers itself did not produce for tests/data/hf-tiny (random biases and LayerNorm parameters, Falcon-7B's
multi-query block with one LayerNorm, Falcon's sequential block, ALiBi with a head count that is not a power of
two), and it checks itself first against the goldens transformers did produce.

Needs Debian's python3-torch (run with /usr/bin/python3); no transformers, no safetensors package.

  /usr/bin/python3 tools/hf_reference.py verify tests/data/hf-tiny/bloom tests/data/hf-tiny/falcon-new
      recomputes every golden tensor of transformers' own goldens from their checkpoints (same input ids and
      output gradients) and fails if any differs beyond 2e-5 (outputs) / 2e-4 (gradients) or a greedy id does.
  /usr/bin/python3 tools/hf_reference.py make OUTDIR VARIANT [SEED]
      writes OUTDIR/{config.json, model.safetensors, golden.safetensors} for VARIANT (see VARIANTS below), in the
      golden format of tests/data/hf-tiny/README.md.

The reference computes in float64 (the goldens are stored as float32), so it is at least as exact as an fp32
transformers run; greedy ids are argmax over float64 logits, recomputed over the whole sequence each step (the
same ids a KV cache gives).
"""
import json
import math
import os
import struct
import sys

import torch

DT = torch.float64

# ---------------------------------------------------------------------------------------------------------
# safetensors, the format only (header length, JSON header, raw little-endian data)

ST_DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8), "F16": (torch.float16, 2),
             "BF16": (torch.bfloat16, 2)}


def st_load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dt, size = ST_DTYPES[t["dtype"]]
        b, e = t["data_offsets"]
        x = torch.frombuffer(bytearray(data[b:e]), dtype=dt) if e > b else torch.zeros(0, dtype=dt)
        out[name] = x.reshape(t["shape"]).clone()
    return out


def st_save(path, tensors):
    header, chunks, off = {}, [], 0
    for name, x in tensors.items():
        x = x.contiguous()
        code = {torch.float32: "F32", torch.int64: "I64"}[x.dtype]
        raw = x.numpy().tobytes()
        header[name] = {"dtype": code, "shape": list(x.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ---------------------------------------------------------------------------------------------------------
# shared pieces

def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(v + eps) * w + b


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def causal_softmax(scores):
    """scores [B, heads, T, T] for positions 0..T-1: key j visible to query i iff j <= i."""
    T = scores.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


# ---------------------------------------------------------------------------------------------------------
# BLOOM

def alibi_slopes(nh):
    """BLOOM's slopes: the largest power of two n <= nh gets 2^(-8i/n), the rest every other slope of 2n."""
    n = 2 ** int(math.floor(math.log2(nh)))
    s = [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]
    s += [2.0 ** (-4.0 * i / n) for i in range(1, 2 * (nh - n), 2)]
    return torch.tensor(s, dtype=DT)


def bloom_block(p, x, cfg):
    B, T, H = x.shape
    nh = cfg["n_head"]
    hd = H // nh
    eps = cfg["layer_norm_epsilon"]
    ln = layer_norm(x, p["input_layernorm.weight"], p["input_layernorm.bias"], eps)
    qkv = linear(ln, p["self_attention.query_key_value.weight"], p["self_attention.query_key_value.bias"])
    qkv = qkv.view(B, T, nh, 3, hd)  # per head: q, k, v
    q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))  # [B, nh, T, hd]
    # scores = alibi + q k^T / sqrt(hd), alibi = slope * key position (absolute, from 0)
    pos = torch.arange(T, dtype=DT)
    alibi = alibi_slopes(nh).view(1, nh, 1, 1) * pos.view(1, 1, 1, T)
    scores = alibi + (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    ctx = (causal_softmax(scores) @ v).transpose(1, 2).reshape(B, T, H)
    h = linear(ctx, p["self_attention.dense.weight"], p["self_attention.dense.bias"]) + x
    ln2 = layer_norm(h, p["post_attention_layernorm.weight"], p["post_attention_layernorm.bias"], eps)
    m = gelu_tanh(linear(ln2, p["mlp.dense_h_to_4h.weight"], p["mlp.dense_h_to_4h.bias"]))
    return linear(m, p["mlp.dense_4h_to_h.weight"], p["mlp.dense_4h_to_h.bias"]) + h


# ---------------------------------------------------------------------------------------------------------
# Falcon

def falcon_kv_heads(cfg):
    if cfg.get("new_decoder_architecture"):
        return cfg.get("num_kv_heads") or cfg["num_attention_heads"]
    return 1 if cfg.get("multi_query", True) else cfg["num_attention_heads"]


def rope(x, theta):
    """Rotate-half RoPE over positions 0..T-1; x [B, heads, T, hd]."""
    T, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=DT) / hd)
    ang = torch.arange(T, dtype=DT)[:, None] * inv[None, :]
    cos, sin = torch.cos(torch.cat([ang, ang], -1)), torch.sin(torch.cat([ang, ang], -1))
    half = hd // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def falcon_attention(p, x, cfg):
    B, T, H = x.shape
    nh = cfg["num_attention_heads"]
    nkv = falcon_kv_heads(cfg)
    hd = H // nh
    g = nh // nkv
    qkv = linear(x, p["self_attention.query_key_value.weight"], p.get("self_attention.query_key_value.bias"))
    qkv = qkv.view(B, T, nkv, g + 2, hd)  # per KV group: g queries, its key, its value
    q = qkv[:, :, :, :g].reshape(B, T, nh, hd)
    k = qkv[:, :, :, g].unsqueeze(3).expand(B, T, nkv, g, hd).reshape(B, T, nh, hd)
    v = qkv[:, :, :, g + 1].unsqueeze(3).expand(B, T, nkv, g, hd).reshape(B, T, nh, hd)
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k = rope(q, theta), rope(k, theta)
    ctx = (causal_softmax(q @ k.transpose(-1, -2) / math.sqrt(hd)) @ v).transpose(1, 2).reshape(B, T, H)
    return linear(ctx, p["self_attention.dense.weight"], p.get("self_attention.dense.bias"))


def falcon_block(p, x, cfg):
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    act = gelu_erf if cfg.get("activation", "gelu") == "gelu" else gelu_tanh

    def mlp(h):
        u = act(linear(h, p["mlp.dense_h_to_4h.weight"], p.get("mlp.dense_h_to_4h.bias")))
        return linear(u, p["mlp.dense_4h_to_h.weight"], p.get("mlp.dense_4h_to_h.bias"))

    def norm(name, h):
        return layer_norm(h, p[name + ".weight"], p[name + ".bias"], eps)

    new = cfg.get("new_decoder_architecture", False)
    nln = cfg.get("num_ln_in_parallel_attn") or (2 if new else 1)
    if not cfg.get("parallel_attn", True):  # old sequential block
        h = x + falcon_attention(p, norm("input_layernorm", x), cfg)
        return h + mlp(norm("post_attention_layernorm", h))
    if new and nln == 2:  # Falcon-40B/180B: two LayerNorms of x
        return x + falcon_attention(p, norm("ln_attn", x), cfg) + mlp(norm("ln_mlp", x))
    ln = norm("input_layernorm", x)  # Falcon-7B (and Falcon2): one LayerNorm shared by both branches
    return x + falcon_attention(p, ln, cfg) + mlp(ln)


# ---------------------------------------------------------------------------------------------------------
# models

class Model:
    def __init__(self, cfg, tensors):
        self.cfg = cfg
        self.t = {k: v.to(DT) for k, v in tensors.items()}
        self.family = cfg["model_type"]
        self.pre = "transformer." if "transformer.word_embeddings.weight" in self.t else ""
        self.L = cfg.get("n_layer") or cfg.get("num_hidden_layers")
        self.eps = cfg.get("layer_norm_epsilon", 1e-5)

    def block_params(self, i):
        pre = f"{self.pre}h.{i}."
        return {k[len(pre):]: v for k, v in self.t.items() if k.startswith(pre)}

    def block(self, i, x):
        p = self.block_params(i)
        return bloom_block(p, x, self.cfg) if self.family == "bloom" else falcon_block(p, x, self.cfg)

    def embed(self, ids):
        x = self.t[self.pre + "word_embeddings.weight"][ids]
        if self.family == "bloom":
            x = layer_norm(x, self.t[self.pre + "word_embeddings_layernorm.weight"],
                           self.t[self.pre + "word_embeddings_layernorm.bias"], self.eps)
        return x

    def head(self, x):
        x = layer_norm(x, self.t[self.pre + "ln_f.weight"], self.t[self.pre + "ln_f.bias"], self.eps)
        w = self.t.get("lm_head.weight", self.t[self.pre + "word_embeddings.weight"])
        return x @ w.T

    def forward(self, ids, keep=None):
        x = self.embed(ids)
        for i in range(self.L):
            if keep is not None:
                keep.append(x)
            x = self.block(i, x)
        return self.head(x)

    def greedy(self, prompt, n_new):
        ids = prompt.clone()
        for _ in range(n_new):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
        return ids


def goldens(model, ids, grad_outs=None, gen=None):
    """The golden tensors for input ids [B, T]; grad_outs[i] (or random from gen) are block i's output grads."""
    ins = []
    logits = model.forward(ids, ins)
    gold = {"input_ids": ids, "logits": logits}
    for i, x in enumerate(ins):
        x = x.detach().clone().requires_grad_(True)
        y = model.block(i, x)
        gout = grad_outs[i].to(DT) if grad_outs is not None else torch.randn(y.shape, generator=gen, dtype=DT)
        (gin,) = torch.autograd.grad(y, x, gout)
        gold[f"block.{i}.in"], gold[f"block.{i}.out"] = x.detach(), y.detach()
        gold[f"block.{i}.grad_out"], gold[f"block.{i}.grad_in"] = gout, gin
    gold["greedy.prompt"] = ids[:1, :5].clone()
    gold["greedy.output"] = model.greedy(ids[:1, :5], 16)
    return {k: (v if v.dtype == torch.int64 else v.float()) for k, v in gold.items()}


# ---------------------------------------------------------------------------------------------------------
# verify against transformers' own goldens

def verify(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    model = Model(cfg, st_load(os.path.join(d, "model.safetensors")))
    want = st_load(os.path.join(d, "golden.safetensors"))
    grad_outs = [want[f"block.{i}.grad_out"] for i in range(model.L)]
    got = goldens(model, want["input_ids"], grad_outs)
    ok = True
    for name in sorted(want):
        if want[name].dtype == torch.int64:
            same = torch.equal(want[name], got[name])
            print(f"  {name:22s} {'identical' if same else 'DIFFERENT'}")
            ok &= same
            continue
        err = (want[name].double() - got[name].double()).abs().max().item()
        tol = 2e-4 if "grad" in name else 2e-5
        print(f"  {name:22s} max|err| {err:.3e} {'ok' if err <= tol else 'FAIL'}")
        ok &= err <= tol
    print(f"{d}: {'agrees with transformers' if ok else 'DIFFERS from transformers'}")
    return ok


# ---------------------------------------------------------------------------------------------------------
# make a variant

VARIANTS = {
    # Falcon-7B's block: multi-query (1 KV head), one LayerNorm shared by the parallel attention and MLP
    "falcon-7b": dict(model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=64,
                      num_hidden_layers=2, num_attention_heads=4, new_decoder_architecture=False,
                      multi_query=True, parallel_attn=True, bias=False, alibi=False, layer_norm_epsilon=1e-5,
                      activation="gelu", max_position_embeddings=2048, rope_theta=10000.0),
    # new_decoder_architecture with biases on every linear, 8 query heads in 2 KV groups of 4
    "falcon-bias": dict(model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=64,
                        num_hidden_layers=2, num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True,
                        multi_query=False, parallel_attn=True, bias=True, alibi=False, layer_norm_epsilon=1e-5,
                        activation="gelu", max_position_embeddings=2048, rope_theta=10000.0),
    # the old sequential block, multi-head ([nh, 3, hd] fused layout), with biases
    "falcon-seq": dict(model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=48,
                       num_hidden_layers=2, num_attention_heads=6, new_decoder_architecture=False,
                       multi_query=False, parallel_attn=False, bias=True, alibi=False, layer_norm_epsilon=1e-5,
                       activation="gelu", max_position_embeddings=2048, rope_theta=10000.0),
    # BLOOM with random biases and LayerNorm parameters, 6 heads (ALiBi slopes of a non-power of two)
    "bloom-bias": dict(model_type="bloom", architectures=["BloomForCausalLM"], hidden_size=48, n_layer=2, n_head=6,
                       layer_norm_epsilon=1e-5, apply_residual_connection_post_layernorm=False),
}


def make_tensors(cfg, gen):
    """Random parameters: N(0, 0.08) weights and biases, LayerNorm gains 1 + N(0, 0.1), shifts N(0, 0.1)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    fam = cfg["model_type"]
    nh = cfg.get("n_head") or cfg["num_attention_heads"]
    hd = H // nh
    L = cfg.get("n_layer") or cfg.get("num_hidden_layers")
    w = lambda *s: torch.randn(*s, generator=gen) * 0.08
    t = {"transformer.word_embeddings.weight": w(V, H)}

    def norm(name):
        t[name + ".weight"] = 1.0 + torch.randn(H, generator=gen) * 0.1
        t[name + ".bias"] = torch.randn(H, generator=gen) * 0.1

    def lin(name, o, i, bias):
        t[name + ".weight"] = w(o, i)
        if bias:
            t[name + ".bias"] = w(o)

    if fam == "bloom":
        norm("transformer.word_embeddings_layernorm")
    for i in range(L):
        p = f"transformer.h.{i}."
        if fam == "bloom":
            norm(p + "input_layernorm")
            norm(p + "post_attention_layernorm")
            lin(p + "self_attention.query_key_value", 3 * H, H, True)
            lin(p + "self_attention.dense", H, H, True)
            lin(p + "mlp.dense_h_to_4h", 4 * H, H, True)
            lin(p + "mlp.dense_4h_to_h", H, 4 * H, True)
            continue
        new, bias = cfg["new_decoder_architecture"], cfg["bias"]
        nkv = falcon_kv_heads(cfg)
        if not cfg["parallel_attn"]:
            norm(p + "input_layernorm")
            norm(p + "post_attention_layernorm")
        elif new and (cfg.get("num_ln_in_parallel_attn") or 2) == 2:
            norm(p + "ln_attn")
            norm(p + "ln_mlp")
        else:
            norm(p + "input_layernorm")
        lin(p + "self_attention.query_key_value", (nh + 2 * nkv) * hd, H, bias)
        lin(p + "self_attention.dense", H, H, bias)
        ff = cfg.get("ffn_hidden_size") or 4 * H
        lin(p + "mlp.dense_h_to_4h", ff, H, bias)
        lin(p + "mlp.dense_4h_to_h", H, ff, bias)
    norm("transformer.ln_f")
    return t


def make(out, variant, seed):
    cfg = dict(VARIANTS[variant], vocab_size=512, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
               dtype="float32", initializer_range=0.08)
    gen = torch.Generator().manual_seed(seed)
    tensors = make_tensors(cfg, gen)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(sorted(cfg.items())), f, indent=2)
        f.write("\n")
    st_save(os.path.join(out, "model.safetensors"), tensors)
    model = Model(cfg, tensors)
    ids = torch.randint(3, cfg["vocab_size"], (2, 12), generator=gen)
    st_save(os.path.join(out, "golden.safetensors"), goldens(model, ids, gen=gen))
    print(f"{out}: {variant}, {sum(x.numel() for x in tensors.values())} parameters")


def main(argv):
    if len(argv) >= 2 and argv[0] == "verify":
        return 0 if all([verify(d) for d in argv[1:]]) else 1
    if len(argv) in (3, 4) and argv[0] == "make" and argv[2] in VARIANTS:
        make(argv[1], argv[2], int(argv[3]) if len(argv) == 4 else 1234)
        return 0
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    print("variants: " + ", ".join(VARIANTS), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
