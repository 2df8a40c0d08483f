"""What every part of the package runs on, beside the paper: the one-line user errors (errors.py), atomic file
writes and UTF-8 reading (files.py), the device, its precision and kernel switches (device.py), and the model
FLOPs of a training step (model_flops.py). Nothing is imported here."""
