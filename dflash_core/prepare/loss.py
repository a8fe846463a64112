"""An exact large-vocabulary loss for drafter training: chunked linear cross-entropy.

The drafter's rows go through the target's frozen LM head (vocab 49k-65k on real targets). Materialising
the logits of every training row, [rows, vocab] in float32, and their gradient dominated a training step
(about 15 s of a 15 s step at vocab 49,152; `studies/drafter_lab/profile_train_step.py`). Here the head is applied chunk
by chunk of rows: each chunk's logits give its loss and, in the same pass, the gradient with respect to the
rows (`softmax - target`, times the head), so no [rows, vocab] tensor ever lives longer than one chunk and
the backward pass is a multiply. This is the fused linear cross-entropy of Liger-Kernel and Cut
Cross-Entropy, written for CPU. The loss is the exact cross-entropy (no sampling, no vocabulary cut).

Targets are soft: each row has K candidate ids with probabilities summing to one (a hard label is K=1,
probability 1; distillation mixes the label with the target's top-k distribution). The head's matmuls can
run in bfloat16 (`compute_dtype`) while the softmax and the loss stay float32.
"""

from __future__ import annotations

import torch

# About 32 M logits per chunk (128 MiB in float32): vocab 65,536 -> 512 rows, the mini's 2,048 -> 16,384.
CHUNK_ELEMENTS = 1 << 25


def chunk_rows(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    return max(16, elements // max(1, vocab))


class _LinearSoftCrossEntropy(torch.autograd.Function):
    """Per-row -sum_k p_k log softmax(h W^T)[id_k], with d/dh computed in the forward pass chunk by chunk."""

    @staticmethod
    def forward(ctx, h, weight, ids, probs, compute_dtype, chunk):
        rows = h.shape[0]
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32  # softmax and loss precision
        loss = torch.empty(rows, dtype=acc, device=h.device)
        top = torch.empty(rows, dtype=torch.long, device=h.device)
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(h) if want_grad else None
        w = weight.detach().to(compute_dtype)
        for s in range(0, rows, chunk):
            e = min(rows, s + chunk)
            logits = h[s:e].detach().to(compute_dtype) @ w.T  # [c, V]: the only chunk-sized tensors are here
            p = probs[s:e].to(acc)
            picked = (p * logits.gather(1, ids[s:e]).to(acc)).sum(-1)
            m, top[s:e] = logits.max(dim=-1)  # the argmax comes with the max
            # Few passes over [c, V] (they cost as much as the matmuls on CPU): shifted logits straight into the
            # softmax precision, exp in place, one sum, and the normalisation fused into the cast for the matmul.
            z = torch.sub(logits, m.unsqueeze(-1), out=torch.empty(logits.shape, dtype=acc)) if logits.dtype != acc \
                else logits.sub_(m.unsqueeze(-1))
            del logits
            total = z.exp_().sum(-1)
            loss[s:e] = m.to(acc) + total.log() - picked
            if want_grad:
                g = torch.mul(z, total.reciprocal().unsqueeze(-1), out=torch.empty(z.shape, dtype=compute_dtype))
                del z
                g.scatter_add_(1, ids[s:e], -p.to(compute_dtype))
                grad[s:e] = (g @ w).to(h.dtype)
        if want_grad:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(top)
        return loss, top  # float32 (float64 for float64 rows) whatever the matmuls ran in

    @staticmethod
    def backward(ctx, grad_loss, _grad_top):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype).unsqueeze(-1), None, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor | None = None,
                         *, compute_dtype: torch.dtype | None = None, chunk: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row loss [R], argmax id per row [R]) of rows h [R, H] under the frozen head `weight` [V, H].

    `ids` [R] (hard labels) or [R, K] with `probs` [R, K] (soft targets, rows summing to 1). The head gets no
    gradient (it is the target's, frozen); `h` does. `compute_dtype` (default h's dtype) is the matmuls' dtype.
    """
    if ids.dim() == 1:
        ids = ids.unsqueeze(-1)
    if probs is None:
        probs = torch.ones(ids.shape, dtype=torch.float32, device=h.device)
    chunk = chunk or chunk_rows(weight.shape[0])
    return _LinearSoftCrossEntropy.apply(h.contiguous(), weight, ids, probs, compute_dtype or h.dtype, chunk)
