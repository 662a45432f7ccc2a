"""A few AdamW training steps of a tiny model, for the tests that run a whole step with a
fast path on and off (test_cpu_kernels.py, test_cpu_attention.py)."""
import numpy as np

import minitorch_gpu as mt
from minitorch_gpu.nn import GPTConfig, model_for


def train_steps(arch: str, shape: tuple, dropout: float = 0.0, steps: int = 3, **sizes):
    """The loss at each of ``steps`` AdamW steps of a GPT or Llama (``arch``) built from
    seed 0 on token batches of ``shape``, and the gradients of the first step (after it,
    Adam's m / sqrt(v) of a near-zero gradient would magnify float32 rounding: compare the
    parameters through the losses). ``sizes`` set n_embd and block_size."""
    extra = dict(n_kv_head=2, ffn_hidden=96) if arch == "llama" else {}
    config = GPTConfig(arch=arch, n_layer=2, n_head=4, vocab_size=50, dropout=dropout,
                       **sizes, **extra)
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 50, shape), rng.integers(0, 50, shape)
    mt.manual_seed(0)
    model = model_for(config)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3,
                                           betas=(0.9, 0.99))
    losses, grads = [], None
    for _ in range(steps):
        _, loss = model(mt.tensor(idx), mt.tensor(targets))
        optimizer.zero_grad()
        loss.backward()
        if grads is None:
            grads = {k: p.grad.data.copy() for k, p in model.named_parameters()}
        optimizer.step()
        losses.append(float(loss.item()))
    return losses, grads
