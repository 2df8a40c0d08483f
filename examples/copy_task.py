"""The notebook's `example_simple_model`, in plain code: a small Transformer learns to copy its input.

    uv run python examples/copy_task.py

No Trainer, no config, no run directory: `make_model`, `LabelSmoothing`, `rate`, `run_epoch` and
`greedy_decode`, as the Annotated Transformer uses them. Sources are 10 random tokens that start
with the start symbol; the target is the source itself.
"""

import torch
from torch.optim.lr_scheduler import LambdaLR

from annotated_transformer import (LabelSmoothing, SimpleLossCompute, data_gen, greedy_decode, make_model, rate,
                                   run_epoch)

V, PAD, START = 11, 0, 1  # token 0 pads, 1 starts every sequence, 2..10 are the tokens to copy


def example_simple_model(epochs: int = 20, batches: int = 20, seed: int = 0) -> tuple[float, torch.Tensor]:
    """Train on `epochs` x `batches` batches of 128 random sequences; return (last loss, the decoded copy)."""
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=128, d_ff=256, h=4, dropout=0.0)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, padding_idx=PAD, smoothing=0.1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    # rate() is the paper's schedule (Section 5.3); the factor 0.3 keeps a 128-wide model's peak stable
    scheduler = LambdaLR(optimizer, lambda step: rate(step, model_size=128, factor=0.3, warmup=100))
    for epoch in range(epochs):  # run_epoch puts the model in training or evaluation mode itself
        loss, _ = run_epoch(data_gen(V, 128, batches), model, loss_compute, optimizer, scheduler, log=None)
        eval_loss, _ = run_epoch(data_gen(V, 128, 5), model, loss_compute, mode="eval")
        print(f"epoch {epoch + 1:2d} | train loss {loss:.3f} | eval loss {eval_loss:.3f}")
    src = torch.tensor([[START, 2, 3, 4, 5, 6, 7, 8, 9, 10]])  # (1, 10)
    with torch.no_grad():
        copy = greedy_decode(model, src, (src != PAD).unsqueeze(-2), max_len=src.size(1), start_symbol=START)
    return loss, copy


if __name__ == "__main__":
    _, copy = example_simple_model()
    print("source: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]")
    print(f"copy:   {copy[0].tolist()}")
