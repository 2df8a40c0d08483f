"""Extensions of the Transformer discussed beside the paper, each off by default and exact when off.

    scheduled_sampling.py  train on the model's own predictions in a second decoder pass
    guided_attention.py    a loss that keeps encoder-decoder attention near the diagonal
    objective.py           the training step's loss with either switched on (objective.* in the config)
    token_merging.py       fewer source tokens after chosen encoder layers (model.merge_ratio)

Local attention changes only masks, so it is `model.local_window` (model.py, masks.local_mask).
"""
