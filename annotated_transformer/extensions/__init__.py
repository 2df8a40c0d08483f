"""Extensions of the Transformer discussed beside the paper: each has its own config section, is off by
default and exact when off, and reaches the paper's classes only as a subclass or an attention hook.

    local_attention.py     self-attention within a window of positions (LocalAttentionModel)
    token_merging.py       fewer source tokens after chosen encoder layers: merged or pruned (TokenMergingModel)
    scheduled_sampling.py  train on the model's own predictions in a second decoder pass
    guided_attention.py    a loss that keeps encoder-decoder attention near the diagonal (an attention hook)
    objective.py           the training step's loss with either of the last two switched on
    r_drop.py              R-Drop: two dropout passes per batch and a symmetric KL between them
    cutoff.py              token cutoff: source tokens replaced by <unk> at random in training
    subword_sampling.py    subword regularisation: a sampled segmentation of each training sentence every epoch
    bidirectional.py       bidirectional training: pairs also served reversed (English -> German) in the first epochs
    ema.py                 a moving average of the weights, validated and saved in their place
    builder.py             a Config -> model, loss, objective, optimizer, weight average, resegmentation
"""
