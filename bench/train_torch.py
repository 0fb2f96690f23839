#!/usr/bin/env python3
"""train_torch.py - the prompt-tuning step of bench_train (deep_ptune on sst2) in PyTorch, on the identical
batches, for a tokens/s baseline measured on the same machine.

Reads the file written by `bench_train --local-only --dump-batch FILE`: the optimizer settings, the initial
trainable parameters (prompts [P, H], deep prompts [L, P, H], score [C, H]) and every step's batch (ids
[B, T] right-padded, last [B], labels [B]) with our loss. Loads the frozen Llama weights from the model's
model.safetensors with json + numpy only, then runs the same workflow Hugging Face / Petals code would:

    embeddings -> [prompts ; embeddings] -> for each block: add deep prompt l to the first P positions,
    block (RMSNorm, q/k/v, rotate-half RoPE, causal softmax attention, o, RMSNorm, SwiGLU MLP)
    -> drop the P prefix -> final RMSNorm -> the last real token of each row -> score -> cross-entropy
    -> backward (to the prompts, deep prompts and score only) -> AdamW with our warmup/decay schedule.

Step 0 is the warm-up (not timed); steps 1..R are timed. tokens/s counts the positions really run:
B x (T + P). The loss of every step is compared with ours (step 0 starts from identical parameters, so it
must agree to float rounding; exit status 3 if not).

usage: train_torch.py DUMP [--threads N] [--model DIR] [--quiet]
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the shell wrapper checks first; this is for direct use
    sys.exit(f"train_torch.py: PyTorch is not installed ({e}); apt-get install -y python3-torch python3-numpy")


# ---- inputs --------------------------------------------------------------------------------------------------


def read_dump(path):
    """The dump of bench_train: opts (dict), params (name -> np.ndarray), steps (list of dicts)."""
    opts, params, steps = {}, {}, []
    with open(path) as f:
        lines = iter(f.read().split("\n"))
    if next(lines).strip() != "sepal-train-dump 1":
        sys.exit(f"train_torch.py: {path} is not a bench_train dump (sepal-train-dump 1)")
    model = None
    for line in lines:
        if not line:
            continue
        word, _, rest = line.partition(" ")
        if word == "model":
            model = rest
        elif word == "opts":
            kv = rest.split()
            for k, v in zip(kv[::2], kv[1::2]):
                opts[k] = float(v) if any(c in v for c in ".e") else int(v)
        elif word == "param":
            f2 = rest.split()
            name, nd = f2[0], int(f2[1])
            shape = tuple(int(x) for x in f2[2 : 2 + nd])
            params[name] = np.array(next(lines).split(), dtype=np.float32).reshape(shape)
        elif word == "step":
            f2 = rest.split()
            steps.append({"step": int(f2[0]), "B": int(f2[2]), "T": int(f2[4])})
        elif word in ("ids", "last", "labels"):
            steps[-1][word] = np.array(rest.split(), dtype=np.int64)
        elif word == "loss":
            steps[-1]["loss"] = float(rest)
    for s in steps:
        s["ids"] = s["ids"].reshape(s["B"], s["T"])
    return model, opts, params, steps


def load_safetensors(path):
    """name -> float32 np.ndarray (F32/F16/BF16), with json + numpy only."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = raw[base + a : base + b]
        if t["dtype"] == "F32":
            x = buf.view(np.float32)
        elif t["dtype"] == "F16":
            x = buf.view(np.float16).astype(np.float32)
        elif t["dtype"] == "BF16":
            x = (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[name] = np.array(x).reshape(t["shape"])
    return out


# ---- the model -----------------------------------------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Llama:
    """Frozen Llama blocks + final norm, HF layout, eager PyTorch (what transformers' LlamaModel does)."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.H = cfg["hidden_size"]
        self.L = cfg["num_hidden_layers"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim", self.H // self.nh)
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = float(cfg.get("rope_theta", 10000.0))
        if cfg.get("rope_scaling"):
            sys.exit("train_torch.py: rope_scaling is not implemented here")
        st = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        T = lambda n: torch.from_numpy(st[n])  # noqa: E731  (frozen: requires_grad stays False)
        self.embed = T("model.embed_tokens.weight")
        self.norm = T("model.norm.weight")
        self.layers = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            self.layers.append(
                {k: T(p + n) for k, n in [
                    ("ln1", "input_layernorm.weight"), ("wq", "self_attn.q_proj.weight"),
                    ("wk", "self_attn.k_proj.weight"), ("wv", "self_attn.v_proj.weight"),
                    ("wo", "self_attn.o_proj.weight"), ("ln2", "post_attention_layernorm.weight"),
                    ("wg", "mlp.gate_proj.weight"), ("wu", "mlp.up_proj.weight"), ("wd", "mlp.down_proj.weight")]})
        # rotate-half RoPE tables, inv_freq as our rope.c computes it (float32)
        i = torch.arange(0, self.hd // 2, dtype=torch.float32)
        self.inv_freq = 1.0 / torch.pow(torch.tensor(self.theta, dtype=torch.float32), 2 * i / self.hd)
        self.rope_cache = {}

    def rope(self, S):
        if S not in self.rope_cache:
            pos = torch.arange(S, dtype=torch.float32)
            ang = pos[:, None] * self.inv_freq[None, :]
            ang = torch.cat((ang, ang), dim=-1)  # [S, hd]
            mask = torch.full((S, S), float("-inf")).triu(1)  # causal (rows are right-padded: nothing else)
            self.rope_cache[S] = (ang.cos(), ang.sin(), mask)
        return self.rope_cache[S]

    def block(self, x, w, cos, sin, mask):
        B, S, H = x.shape
        h = rmsnorm(x, w["ln1"], self.eps)
        q = F.linear(h, w["wq"]).view(B, S, self.nh, self.hd).transpose(1, 2)
        k = F.linear(h, w["wk"]).view(B, S, self.nkv, self.hd).transpose(1, 2)
        v = F.linear(h, w["wv"]).view(B, S, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd) + mask
        att = torch.softmax(att, dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, S, self.nh * self.hd)
        x = x + F.linear(o, w["wo"])
        h = rmsnorm(x, w["ln2"], self.eps)
        return x + F.linear(F.silu(F.linear(h, w["wg"])) * F.linear(h, w["wu"]), w["wd"])


def lr_at(opts, s):
    """Our schedule (client/train/optim.h): linear warmup from 0, then linear decay to 0 at total_steps."""
    lr, wu, tot = opts["lr"], opts["warmup"], opts["total_steps"]
    if wu > 0 and s < wu:
        return lr * s / wu
    if tot <= 0:
        return lr
    return lr * max(0.0, tot - s) / max(1, tot - wu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "1")))
    ap.add_argument("--model", default=None)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model_dir, opts, init, steps = read_dump(a.dump)
    model_dir = a.model or model_dir
    if opts.get("microbatches", 1) != 1 or opts.get("clip_norm", 0) != 0:
        sys.exit("train_torch.py: only microbatches 1 and no clipping are implemented")
    m = Llama(model_dir)
    P = init["prompts"].shape[0]
    prompts = torch.nn.Parameter(torch.from_numpy(init["prompts"].copy()))
    deep = torch.nn.Parameter(torch.from_numpy(init["deep_prompts"].copy()))
    score = torch.nn.Parameter(torch.from_numpy(init["score.weight"].copy()))
    opt = torch.optim.AdamW([prompts, deep, score], lr=opts["lr"], betas=(opts["beta1"], opts["beta2"]),
                            eps=opts["eps"], weight_decay=opts["weight_decay"])

    def step(s, b):
        ids = torch.from_numpy(b["ids"])
        last = torch.from_numpy(b["last"])
        labels = torch.from_numpy(b["labels"])
        B, T = ids.shape
        cos, sin, mask = m.rope(P + T)
        x = F.embedding(ids, m.embed)  # frozen: no gradient
        h = torch.cat((prompts.unsqueeze(0).expand(B, P, m.H), x), dim=1)
        for l, w in enumerate(m.layers):
            h = torch.cat((h[:, :P] + deep[l], h[:, P:]), dim=1)  # deep prompt added to the first P positions
            h = m.block(h, w, cos, sin, mask)
        h = rmsnorm(h[:, P:], m.norm, m.eps)
        pooled = h[torch.arange(B), last]
        loss = F.cross_entropy(F.linear(pooled, score), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for g in opt.param_groups:
            g["lr"] = lr_at(opts, s)
        opt.step()
        return loss.item()

    rates, pos_sum, t_sum, worst, bad0 = [], 0, 0.0, 0.0, False
    for s, b in enumerate(steps):
        t0 = time.perf_counter()
        loss = step(s, b)
        dt = time.perf_counter() - t0
        pos = b["B"] * (b["T"] + P)
        diff = abs(loss - b["loss"]) if "loss" in b else float("nan")
        if s == 0:
            bad0 = not diff <= 1e-4 * max(1.0, abs(b["loss"]))
            if not a.quiet:
                print(f"  warm-up: T {b['T']}, loss {loss:.6f} (ours {b.get('loss', float('nan')):.6f}, "
                      f"|diff| {diff:.2e}{' MISMATCH' if bad0 else ''})")
            continue
        worst = max(worst, diff)
        rates.append(pos / dt)
        pos_sum += pos
        t_sum += dt
        if not a.quiet:
            print(f"  rep {s - 1}: pytorch {pos / dt:.0f} tok/s (T {b['T']}, {pos} positions, {dt * 1e3:.1f} ms, "
                  f"loss {loss:.6f}, ours {b.get('loss', float('nan')):.6f})")
    if not rates:
        sys.exit("train_torch.py: the dump has no timed steps (run bench_train with --reps >= 1)")
    print(f"train step pytorch {torch.__version__} ({a.threads} threads, batch {steps[0]['B']}, P {P}): "
          f"median {statistics.median(rates):.1f} tok/s over real positions B x (T + P); all reps {pos_sum} "
          f"positions in {t_sum:.3f} s = {pos_sum / t_sum:.1f} tok/s; max |loss - ours| over timed steps "
          f"{worst:.2e}")
    if bad0:
        print("train_torch.py: the warm-up loss differs from ours on identical parameters and batch", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
