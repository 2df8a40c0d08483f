"""The lab: how we measure. Nothing here is needed to train or to translate.

    benchmark.py            our fast path against the notebook-style pipeline, training and decoding
    shape_benchmark.py      the fast path's training cost over batch sizes and sentence lengths
    engine_benchmark.py     our decoder against CTranslate2 (float32, int8) on the same weights
    extension_benchmark.py  what each extension switch costs, in interleaved rounds
    hardware.py             what the benchmarks measure against: matmul peak, peak memory, a fresh process
    sweep.py                a grid of overrides x seeds, each run a training of its own, resumable
    seed_statistics.py      a sweep's figures: mean +/- sd over seeds per setting, time to target, sweep.md/.csv

Nothing is imported here, so `import annotated_transformer.lab.sweep` loads only what it needs.
"""
