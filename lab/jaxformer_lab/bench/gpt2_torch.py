"""A nanoGPT-style GPT-2 training step in PyTorch, the other peer jaxformer's step is timed
against (`jaxformer bench gpt2-peers`). This module imports torch: import it only where
torch is installed (the `torch` extra).

The model is gpt2_jax's, module for module (pre-LN, learned positions, tied embedding,
gelu_tanh, biases, LayerNorm eps 1e-5), started from the same weights
(`GPT2.load(gpt2_jax.init_params(...))`) on the same tokens; attention through
`F.scaled_dot_product_attention(is_causal=True)`. bfloat16 compute is autocast (so, as in
nanoGPT, the residual stream stays float32: autocast casts the inputs of matrix
products only); logits cast to float32 before the cross-entropy. AdamW with gpt2_jax's
settings (weight decay on every parameter), fused on CUDA. `mode` is torch.compile's mode
for the model (loss included), or "eager".
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from jaxformer.checks import BadValue, check_choice
from jaxformer_lab.bench import gpt2_jax
from jaxformer_lab.bench.rounds import Program

MODES = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class Block(nn.Module):
    """One pre-LN layer; module names match gpt2_jax's parameter names."""

    def __init__(self, d_model: int, heads: int, d_ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc, self.proj = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, E] -> [B, T, E]."""
        B, T, E = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, E // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, H, T, D]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(B, T, E))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT-2 of sizes `s` whose forward is the mean next-token loss of tokens [B, T + 1]."""

    def __init__(self, s: dict):
        super().__init__()
        E = s["d_model"]
        self.wte, self.wpe = nn.Embedding(s["vocab"], E), nn.Embedding(s["context"], E)
        self.blocks = nn.ModuleList(Block(E, s["heads"], s["d_ff"]) for _ in range(s["layers"]))
        self.ln_f = nn.LayerNorm(E)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = self.wte(inputs) + self.wpe.weight[: inputs.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight).float()  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def load(self, params: dict) -> None:
        """Copy in gpt2_jax's parameters (NumPy; dense matrices [in, out] transposed)."""
        pairs = [(self.wte.weight, params["wte"]), (self.wpe.weight, params["wpe"])]
        pairs += [(self.ln_f.weight, params["ln_f_scale"]), (self.ln_f.bias, params["ln_f_bias"])]
        for block, p in zip(self.blocks, params["blocks"], strict=True):
            for name in ("ln1", "ln2"):
                norm = getattr(block, name)
                pairs += [(norm.weight, p[f"{name}_scale"]), (norm.bias, p[f"{name}_bias"])]
            for name in ("qkv", "out", "fc", "proj"):
                dense = getattr(block, name)
                pairs += [(dense.weight, p[f"{name}_w"].T), (dense.bias, p[f"{name}_b"])]
        for tensor, array in pairs:
            if tuple(tensor.shape) != array.shape:
                raise BadValue(f"parameter {tuple(tensor.shape)} given {array.shape}")
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(array)))


def make_step(model: nn.Module, params, *, device: str, dtype="bfloat16", lr: float = 1e-4):
    """step(tokens) -> loss: forward (autocast to bfloat16 unless dtype is float32),
    backward, AdamW on `params` (fused on CUDA)."""
    optimizer = torch.optim.AdamW(
        params, lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=device == "cuda"
    )

    def step(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = model(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def program(
    s: dict, *, mode: str = "default", dtype="bfloat16", lr: float = 1e-4, seed: int = 0
) -> Program:
    """The step on CUDA if there is one (else the CPU) from gpt2_jax.init_params(s, seed),
    on gpt2_jax.batch_tokens(s, seed); the model compiled in `mode` (MODES)."""
    check_choice("mode", mode, MODES)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_float32_matmul_precision("high")  # TF32 where a float32 product is left
    model = GPT2(s).to(device)
    model.load(gpt2_jax.init_params(s, seed))
    compiled = model if mode == "eager" else torch.compile(model, mode=mode)
    step = make_step(compiled, model.parameters(), device=device, dtype=dtype, lr=lr)
    tokens = torch.from_numpy(gpt2_jax.batch_tokens(s, seed)).to(device, torch.long)

    def run(k: int) -> float:
        for _ in range(k):
            loss = step(tokens)
        return loss.item()  # waits for the device

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    info = dict(device=name, mode=mode, attention="F.scaled_dot_product_attention")

    def peak_bytes() -> int | None:
        return torch.cuda.max_memory_allocated() if device == "cuda" else None

    return Program(run, sum(p.numel() for p in model.parameters()), info, peak_bytes)
