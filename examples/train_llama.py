#!/usr/bin/env python
"""Train a small Llama-style byte-level language model whose norms are ``engine.RMSNorm``.

The model: token embedding -> N pre-norm blocks (RMSNorm -> causal self-attention with RoPE, RMSNorm ->
SwiGLU MLP) -> final RMSNorm -> LM head. The residual stream is carried *beside* the hidden state,
so every norm is a fused ``residual += x; h = norm(residual)`` in one engine kernel:

    h, residual = norm(sublayer_out, residual=residual)

The data: CPython's own documentation topics (``pydoc_data.topics``, ~0.5 MB of English prose and
code that ships with Python: no download), as UTF-8 bytes (vocab 256); the last 5% is validation.

    python examples/train_llama.py                          # CPU: 0.9M-param model, ~1.5 min on 2 cores
    python examples/train_llama.py --device cuda            # GPU: bigger model, bf16 autocast
    ENGINE_USE_RMSNORM_TRITON=1 python examples/train_llama.py --device cuda --compile
    python examples/train_llama.py --check-against-torch    # logits/grads parity vs torch.nn.RMSNorm

Ends with a ``final: train_loss=... val_loss=... tokens_per_s=... backend=...`` line and exits 1 if
the validation loss did not fall below 0.8x its initial value, so CI can use it as a smoke test.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

try:
    import engine
except ImportError:  # not installed: use the checkout this example lives in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import engine
from engine.backend import OpFamily

# Defaults per device: (d_model, layers, heads, seq_len, batch_size, steps, lr).
DEFAULTS = {
    "cpu": dict(d_model=128, layers=4, heads=4, seq_len=128, batch_size=16, steps=400, lr=3e-3),
    "cuda": dict(d_model=512, layers=8, heads=8, seq_len=256, batch_size=64, steps=300, lr=1e-3),
}
EPS = 1e-5


# ----------------------------------------------------------------------------------------- data
def load_text_bytes() -> torch.Tensor:
    """The stdlib's pydoc topics, concatenated in sorted key order, as a uint8 tensor of bytes."""
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics))
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)


def get_batch(data, batch_size, seq_len, gen, device):
    """Random windows of ``seq_len + 1`` bytes: inputs and next-byte targets."""
    ix = torch.randint(len(data) - seq_len - 1, (batch_size,), generator=gen)
    xy = torch.stack([data[i : i + seq_len + 1] for i in ix.tolist()]).long()
    return xy[:, :-1].to(device), xy[:, 1:].to(device)


# ---------------------------------------------------------------------------------------- model
def rope_tables(seq_len, head_dim, device, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    freqs = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, head_dim], "rotate half" layout (as in Llama)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).type_as(x)


def add_and_norm(norm, x, residual):
    """``residual = residual + x; return norm(residual), residual`` (``residual=None``: start the stream).

    engine.RMSNorm does the add and the norm in one fused kernel; torch.nn.RMSNorm (used by
    --check-against-torch) takes the same path written out in PyTorch.
    """
    if residual is None:
        return norm(x), x
    if isinstance(norm, engine.RMSNorm):
        return norm(x, residual=residual)
    residual = residual + x
    return norm(residual), residual


class Attention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        hidden = 64 * math.ceil(8 * d_model / 3 / 64)
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, d_model, heads, norm_cls):
        super().__init__()
        self.attn_norm, self.attn = norm_cls(d_model, eps=EPS), Attention(d_model, heads)
        self.mlp_norm, self.mlp = norm_cls(d_model, eps=EPS), SwiGLU(d_model)

    def forward(self, x, residual, cos, sin):
        # x: the previous sublayer's output, not yet added to the residual stream.
        h, residual = add_and_norm(self.attn_norm, x, residual)
        x = self.attn(h, cos, sin)
        h, residual = add_and_norm(self.mlp_norm, x, residual)
        return self.mlp(h), residual


class Llama(nn.Module):
    def __init__(self, vocab, d_model, layers, heads, max_seq_len, tie_embeddings=False, norm_cls=engine.RMSNorm):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, norm_cls) for _ in range(layers))
        self.norm = norm_cls(d_model, eps=EPS)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        cos, sin = rope_tables(max_seq_len, d_model // heads, self.embed.weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2 style init; output projections scaled down by depth
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)
        if tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, idx):
        t = idx.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x, residual = self.embed(idx), None  # residual stream in fp32 (the embedding's dtype)
        for block in self.blocks:
            x, residual = block(x, residual, cos, sin)
        h, _ = add_and_norm(self.norm, x, residual)
        return self.lm_head(h)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.no_grad()
def evaluate(model, data, seq_len, batch_size, device, autocast):
    """Mean loss over the whole split, in consecutive non-overlapping windows (deterministic)."""
    model.eval()
    n = (len(data) - 1) // seq_len
    x_all = data[: n * seq_len].long().view(n, seq_len)
    y_all = data[1 : n * seq_len + 1].long().view(n, seq_len)
    total = 0.0
    for i in range(0, n, batch_size):
        x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
        with autocast():
            total += loss_fn(model(x), y).item() * len(x)
    model.train()
    return total / n


# ----------------------------------------------------------------------------------- parity check
def check_against_torch(model, args, data, device):
    """Same weights in a torch.nn.RMSNorm model: logits, loss and every gradient must match (fp32)."""
    with torch.no_grad():  # random norm weights, so the weight path is exercised too
        for m in model.modules():
            if isinstance(m, engine.RMSNorm):
                m.weight.normal_(1.0, 0.2)
    ref = Llama(256, args.d_model, args.layers, args.heads, args.seq_len, args.tie_embeddings,
                norm_cls=nn.RMSNorm).to(device)
    ref.load_state_dict(model.state_dict())  # strict: engine.RMSNorm's keys are torch's ("weight")
    x, y = get_batch(data, args.batch_size, args.seq_len, torch.Generator().manual_seed(args.seed), device)
    out = {}
    for name, m in (("engine", model), ("torch", ref)):
        m.zero_grad(set_to_none=True)
        logits = m(x)
        loss = loss_fn(logits, y)
        loss.backward()
        out[name] = logits.detach(), loss.item(), {k: p.grad for k, p in m.named_parameters()}
    (le, loss_e, ge), (lt, loss_t, gt) = out["engine"], out["torch"]
    logit_err = (le - lt).abs().max().item()
    grad_err = max(((ge[k] - gt[k]).norm() / gt[k].norm().clamp_min(1e-30)).item() for k in gt)
    print(f"parity vs torch.nn.RMSNorm: loss {loss_e:.6f} vs {loss_t:.6f}, max |logits diff| {logit_err:.2e}, "
          f"max relative grad error {grad_err:.2e} over {len(gt)} parameters")
    torch.testing.assert_close(le, lt, atol=1e-4, rtol=1e-4)
    assert grad_err < 1e-4, f"gradients differ: max relative error {grad_err:.2e}"
    print("parity: OK")


# ---------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def per_device(key, what=""):
        return f"{what}(default: {DEFAULTS['cpu'][key]} on CPU, {DEFAULTS['cuda'][key]} on CUDA)"

    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda when available")
    p.add_argument("--steps", type=int, help=per_device("steps", "optimizer steps "))
    p.add_argument("--batch-size", type=int, help=per_device("batch_size"))
    p.add_argument("--seq-len", type=int, help=per_device("seq_len"))
    p.add_argument("--d-model", type=int, help=per_device("d_model"))
    p.add_argument("--layers", type=int, help=per_device("layers"))
    p.add_argument("--heads", type=int, help=per_device("heads"))
    p.add_argument("--lr", type=float, help=per_device("lr", "peak AdamW learning rate "))
    p.add_argument("--seed", type=int, default=0, help="seeds init and batch sampling (default: 0)")
    p.add_argument("--log-every", type=int, default=50, help="steps between log lines (default: 50)")
    p.add_argument("--tie-embeddings", action="store_true", help="share the embedding and LM-head weights")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--check-against-torch", action="store_true",
                   help="only check logits/gradients against a torch.nn.RMSNorm copy of the model, then exit")
    args = p.parse_args(argv)
    for k, v in DEFAULTS[args.device].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv=None) -> int:
    t0 = time.perf_counter()
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    # Resolve the backend now: a backend that cannot run fails here, with engine's fix-it message.
    backend = engine.backend.select_backend(OpFamily.RMSNORM, device).value
    desc = engine.backend.describe()["rmsnorm"]
    print(f"engine rmsnorm backend on {device.type}: {desc[device.type]} ({desc['flag']}; "
          f"cuda -> {desc['cuda']}, cpu -> {desc['cpu']})")

    data = load_text_bytes()
    n_val = len(data) // 20
    train_data, val_data = data[:-n_val], data[-n_val:]
    print(f"data: pydoc_data.topics, {len(data):,} bytes (train {len(train_data):,}, "
          f"val {len(val_data):,}), byte-level vocab 256")

    model = Llama(256, args.d_model, args.layers, args.heads, args.seq_len, args.tie_embeddings).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, d_model {args.d_model}, {args.layers} layers, "
          f"{args.heads} heads, seq {args.seq_len}, batch {args.batch_size}, {args.steps} steps, lr {args.lr}")

    if args.check_against_torch:
        check_against_torch(model, args, train_data, device)
        return 0

    # bf16 autocast on GPU (the residual stream stays fp32: engine keeps residual_out in the dtype of
    # the residual passed in, here the fp32 embedding output); plain fp32 on CPU.
    if device.type == "cuda":
        autocast = functools.partial(torch.autocast, "cuda", dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    fwd = torch.compile(model) if args.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norm weights
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(  # linear warmup, cosine decay to 10% of peak
        opt, lambda s: min((s + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * min(s / args.steps, 1.0)))))

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    val_loss0 = evaluate(model, val_data, args.seq_len, args.batch_size, device, autocast)
    print(f"initial val loss {val_loss0:.4f} (ln 256 = {math.log(256):.4f})")

    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch_size * args.seq_len
    t_start = t_log = time.perf_counter()
    t_warm = None  # end of the first log interval: tokens/s after it leaves out warm-up and compilation
    train_loss = float("nan")
    for step in range(1, args.steps + 1):
        x, y = get_batch(train_data, args.batch_size, args.seq_len, gen, device)
        with autocast():
            loss = loss_fn(fwd(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if step % args.log_every == 0 or step == args.steps:
            train_loss = loss.item()  # syncs
            now = time.perf_counter()
            steps_done = step % args.log_every or args.log_every
            print(f"step {step:5d}  train loss {train_loss:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"{steps_done * tokens_per_step / (now - t_log):,.0f} tokens/s")
            t_log = now
            if t_warm is None and step < args.steps:
                t_warm, warm_steps = now, step
    sync()
    t_end = time.perf_counter()
    train_time = t_end - t_start
    if t_warm is None:
        tokens_per_s, note = args.steps * tokens_per_step / train_time, "overall"
    else:
        tokens_per_s = (args.steps - warm_steps) * tokens_per_step / (t_end - t_warm)
        note = f"after the first {warm_steps} steps"
    val_loss = evaluate(model, val_data, args.seq_len, args.batch_size, device, autocast)
    print(f"val loss {val_loss:.4f} (initial {val_loss0:.4f}); training {train_time:.1f} s "
          f"({tokens_per_s:,.0f} tokens/s {note}); total {time.perf_counter() - t0:.1f} s")
    print(f"final: train_loss={train_loss:.4f} val_loss={val_loss:.4f} tokens_per_s={tokens_per_s:.0f} "
          f"backend={backend}")
    if not (val_loss < 0.8 * val_loss0):  # also catches NaN
        print(f"FAIL: val loss {val_loss:.4f} is not below 0.8 x initial {val_loss0:.4f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
